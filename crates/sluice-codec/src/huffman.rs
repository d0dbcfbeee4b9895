//! JPEG Huffman coding at the bit level, for the entropy index ([`crate::entropy_index`]):
//! the tables a DHT segment defines, a reader over byte-stuffed entropy-coded data that
//! knows where in the file each bit lies, and a writer that stuffs what it writes.
//!
//! Decoding follows libjpeg's reading of the data exactly (code lengths, the `k` loop of a
//! block, zero bits after the data's end), so the index stands where libjpeg-turbo would
//! stand at the same MCU.

/// Bits the decoding table resolves in one lookup; longer codes take the slow path.
const LOOKUP: u32 = 9;

/// A Huffman table as a DHT segment defines it: how many codes of each length 1..=16, then
/// the symbols in code order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HuffSpec {
    pub counts: [u8; 16],
    pub symbols: Vec<u8>,
}

impl HuffSpec {
    /// Parses one table from the front of a DHT body: `(class, id, spec, bytes used)`.
    pub(crate) fn parse(body: &[u8]) -> Option<(u8, u8, Self, usize)> {
        let (&tc_th, rest) = body.split_first()?;
        let counts: [u8; 16] = rest.get(..16)?.try_into().ok()?;
        let n: usize = counts.iter().map(|&c| usize::from(c)).sum();
        let symbols = rest.get(16..16 + n)?.to_vec();
        Some((tc_th >> 4, tc_th & 15, Self { counts, symbols }, 17 + n))
    }

    /// The canonical codes, `(symbol, code, length)` in order; `None` when the counts
    /// overflow the code space (libjpeg refuses such a table too) or hold over 256 codes.
    fn codes(&self) -> Option<Vec<(u8, u32, u32)>> {
        if self.symbols.len() > 256 {
            return None;
        }
        let mut out = Vec::with_capacity(self.symbols.len());
        let (mut code, mut k) = (0u32, 0usize);
        for len in 1..=16u32 {
            for _ in 0..self.counts[len as usize - 1] {
                out.push((self.symbols[k], code, len));
                code += 1;
                k += 1;
            }
            if code > (1 << len) {
                return None;
            }
            code <<= 1;
        }
        Some(out)
    }

    /// The same table with every symbol of `wanted` that it lacks added as a code of
    /// length 16 after all its codes, so that every existing code stays as it was. `None`
    /// when the code space has no room for them (the all-ones code stays unused, as the
    /// standard asks).
    pub(crate) fn with_symbols(&self, wanted: impl IntoIterator<Item = u8>) -> Option<Self> {
        let mut out = self.clone();
        for s in wanted {
            if !out.symbols.contains(&s) {
                out.symbols.push(s);
                out.counts[15] = out.counts[15].checked_add(1)?;
            }
        }
        let used: u32 = out.counts.iter().enumerate().map(|(i, &c)| u32::from(c) << (15 - i)).sum();
        (used < 1 << 16).then_some(out)
    }

    /// The DHT segment (marker included) that defines this table as `(class, id)`.
    pub(crate) fn segment(&self, class: u8, id: u8) -> Vec<u8> {
        let len = 2 + 1 + 16 + self.symbols.len();
        let mut seg = vec![0xFF, 0xC4];
        seg.extend_from_slice(&(len as u16).to_be_bytes());
        seg.push(class << 4 | id);
        seg.extend_from_slice(&self.counts);
        seg.extend_from_slice(&self.symbols);
        seg
    }
}

/// A table ready for decoding.
#[derive(Debug, Clone)]
pub(crate) struct Decoder {
    /// By the next `LOOKUP` bits: `length << 8 | symbol`, or 0 for a longer code.
    fast: Vec<u16>,
    /// Per length: the largest code (or -1) and the offset of its symbols in `symbols`.
    max_code: [i32; 17],
    offset: [i32; 17],
    symbols: Vec<u8>,
}

impl Decoder {
    pub(crate) fn new(spec: &HuffSpec) -> Option<Self> {
        let codes = spec.codes()?;
        let mut fast = vec![0u16; 1 << LOOKUP];
        let mut max_code = [-1i32; 17];
        let mut offset = [0i32; 17];
        for (k, &(sym, code, len)) in codes.iter().enumerate() {
            if max_code[len as usize] < 0 {
                offset[len as usize] = k as i32 - code as i32;
            }
            max_code[len as usize] = code as i32;
            if len <= LOOKUP {
                let shift = LOOKUP - len;
                for low in 0..1u32 << shift {
                    fast[((code << shift) | low) as usize] = (len as u16) << 8 | u16::from(sym);
                }
            }
        }
        Some(Self { fast, max_code, offset, symbols: spec.symbols.clone() })
    }

    /// The next symbol and the raw bits of its code `(symbol, code, length)`; `None` for
    /// a code the table does not hold.
    #[inline]
    pub(crate) fn decode(&self, r: &mut BitReader<'_>) -> Option<(u8, u32, u32)> {
        // A code (≤ 16 bits) and its extra bits (≤ 15) without another fill.
        r.ensure(32);
        let look = r.peek(16);
        let e = self.fast[(look >> (16 - LOOKUP)) as usize];
        if e != 0 {
            let len = u32::from(e >> 8);
            r.consume(len);
            return Some(((e & 0xFF) as u8, look >> (16 - len), len));
        }
        for len in LOOKUP + 1..=16 {
            let code = (look >> (16 - len)) as i32;
            if code <= self.max_code[len as usize] {
                r.consume(len);
                let sym = *self.symbols.get((self.offset[len as usize] + code) as usize)?;
                return Some((sym, code as u32, len));
            }
        }
        None
    }
}

/// Codes for writing symbols with a table: by symbol, `(code, length)`.
#[derive(Debug, Clone)]
pub(crate) struct Encoder {
    codes: [(u32, u32); 256],
}

impl Encoder {
    pub(crate) fn new(spec: &HuffSpec) -> Option<Self> {
        let mut codes = [(0, 0); 256];
        for (sym, code, len) in spec.codes()? {
            codes[usize::from(sym)] = (code, len);
        }
        Some(Self { codes })
    }

    /// `(code, length)` of `symbol`; length 0 when the table has no such symbol.
    pub(crate) fn code(&self, symbol: u8) -> (u32, u32) {
        self.codes[usize::from(symbol)]
    }
}

/// The magnitude category of a DC difference (the number of bits of `|v|`).
pub(crate) fn category(v: i32) -> u32 {
    32 - v.unsigned_abs().leading_zeros()
}

/// The `s` extra bits that follow a category-`s` code for `v`.
pub(crate) fn extra_bits(v: i32, s: u32) -> u32 {
    let v = if v < 0 { v - 1 } else { v };
    (v as u32) & ((1u32 << s) - 1)
}

/// The value of `s` extra bits `bits` (JPEG's EXTEND).
#[inline]
pub(crate) fn extend(bits: u32, s: u32) -> i32 {
    if s == 0 {
        0
    } else if bits < 1 << (s - 1) {
        bits as i32 - (1 << s) + 1
    } else {
        bits as i32
    }
}

/// Where a bit lies: `bit` counts the bits of the data before it with stuffing removed,
/// `byte` is the offset (in the stuffed data) of the byte that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct BitPos {
    pub bit: u64,
    pub byte: u64,
}

/// Whether any byte of `x` is 0xFF.
#[inline]
fn has_ff(x: u64) -> bool {
    (!x).wrapping_sub(0x0101_0101_0101_0101) & x & 0x8080_8080_8080_8080 != 0
}

/// Reads the entropy-coded data of a scan (`data` starts at its first byte and may run to
/// the end of the file): a stuffed `FF 00` is one `FF` data byte; at a marker the data
/// ends, and like libjpeg it reads on as zero bits, which [`Self::overran`] reports.
#[derive(Debug)]
pub(crate) struct BitReader<'a> {
    data: &'a [u8],
    /// The next byte to load.
    next: usize,
    acc: u64,
    bits: u32,
    /// Data bytes loaded so far (stuffing removed), counted from the data's start.
    loaded: u64,
    /// Data bytes there were before the marker, once it is reached.
    ended_at: Option<u64>,
}

impl<'a> BitReader<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Self { data, next: 0, acc: 0, bits: 0, loaded: 0, ended_at: None }
    }

    /// A reader standing at `pos` (found by an earlier reader of the same data).
    pub(crate) fn at(data: &'a [u8], pos: BitPos) -> Option<Self> {
        let byte = usize::try_from(pos.byte).ok()?;
        if byte > data.len() {
            return None;
        }
        let mut r = Self { next: byte, loaded: pos.bit / 8, ..Self::new(data) };
        r.fill();
        r.consume((pos.bit % 8) as u32);
        Some(r)
    }

    /// Loads bytes until at least 57 bits are buffered: eight at a time where none of
    /// them is 0xFF (almost everywhere), else one by one.
    #[inline]
    pub(crate) fn fill(&mut self) {
        if self.bits > 56 {
            return;
        }
        if self.ended_at.is_none() {
            if let Some(chunk) = self.data.get(self.next..self.next + 8) {
                let x = u64::from_be_bytes(chunk.try_into().unwrap_or_default());
                if !has_ff(x) {
                    let k = (64 - self.bits) / 8;
                    self.acc = if k == 8 { x } else { self.acc << (8 * k) | x >> (64 - 8 * k) };
                    self.bits += 8 * k;
                    self.next += k as usize;
                    self.loaded += u64::from(k);
                    return;
                }
            }
        }
        while self.bits <= 56 {
            let byte = match self.ended_at {
                Some(_) => 0,
                None => match self.data.get(self.next) {
                    Some(&0xFF) if self.data.get(self.next + 1) == Some(&0) => {
                        self.next += 2;
                        0xFF
                    }
                    Some(&b) if b != 0xFF => {
                        self.next += 1;
                        b
                    }
                    // A marker, fill bytes before one, or the end of the file.
                    _ => {
                        self.ended_at = Some(self.loaded);
                        0
                    }
                },
            };
            self.acc = self.acc << 8 | u64::from(byte);
            self.bits += 8;
            self.loaded += 1;
        }
    }

    /// Makes sure at least `n` (≤ 57) bits are buffered.
    #[inline]
    pub(crate) fn ensure(&mut self, n: u32) {
        if self.bits < n {
            self.fill();
        }
    }

    /// The next `n` (≤ 32) bits, not consumed; [`Self::ensure`] them first.
    #[inline]
    pub(crate) fn peek(&self, n: u32) -> u32 {
        ((self.acc >> (self.bits - n)) & ((1u64 << n) - 1)) as u32
    }

    #[inline]
    pub(crate) fn consume(&mut self, n: u32) {
        self.bits -= n;
    }

    /// The next `n` (≤ 32) bits, consumed.
    #[inline]
    pub(crate) fn bits(&mut self, n: u32) -> u32 {
        if n == 0 {
            return 0;
        }
        self.ensure(n);
        let v = self.peek(n);
        self.consume(n);
        v
    }

    /// Where the next bit lies.
    pub(crate) fn pos(&self) -> BitPos {
        let bit = self.loaded * 8 - u64::from(self.bits);
        let index = bit / 8;
        // The byte is `next`, or among the last (at most eight) data bytes loaded: walk
        // back over them, a stuffed `FF 00` being one.
        let real = self.ended_at.unwrap_or(self.loaded);
        let mut p = self.next;
        for _ in index..real {
            p -= 1;
            if p >= 1 && self.data[p] == 0 && self.data[p - 1] == 0xFF {
                p -= 1;
            }
        }
        BitPos { bit, byte: p as u64 }
    }

    /// Whether more bits were consumed than the data holds.
    pub(crate) fn overran(&self) -> bool {
        self.ended_at.is_some_and(|end| self.loaded * 8 - u64::from(self.bits) > end * 8)
    }
}

/// Writes entropy-coded data into `out`, stuffing a 0 after every `FF` byte.
#[derive(Debug)]
pub(crate) struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    bits: u32,
}

impl<'a> BitWriter<'a> {
    pub(crate) fn new(out: &'a mut Vec<u8>) -> Self {
        Self { out, acc: 0, bits: 0 }
    }

    /// Writes the low `n` (≤ 32) bits of `v`.
    #[inline]
    pub(crate) fn put(&mut self, v: u32, n: u32) {
        self.acc = self.acc << n | u64::from(v) & ((1u64 << n) - 1);
        self.bits += n;
        if self.bits >= 32 {
            self.bits -= 32;
            let word = (self.acc >> self.bits) as u32;
            if has_ff(u64::from(word)) {
                for byte in word.to_be_bytes() {
                    self.push(byte);
                }
            } else {
                self.out.extend_from_slice(&word.to_be_bytes());
            }
        }
    }

    fn push(&mut self, byte: u8) {
        self.out.push(byte);
        if byte == 0xFF {
            self.out.push(0);
        }
    }

    /// Copies the next `n` bits of `r`.
    pub(crate) fn copy(&mut self, r: &mut BitReader<'_>, mut n: u64) {
        while n >= 32 {
            self.put(r.bits(32), 32);
            n -= 32;
        }
        if n > 0 {
            self.put(r.bits(n as u32), n as u32);
        }
    }

    /// Writes out what is buffered, the last byte padded with 1 bits, as the standard asks
    /// before a marker.
    pub(crate) fn finish(&mut self) {
        let pad = (8 - self.bits % 8) % 8;
        self.acc = self.acc << pad | ((1u64 << pad) - 1);
        self.bits += pad;
        while self.bits >= 8 {
            self.bits -= 8;
            self.push((self.acc >> self.bits) as u8);
        }
    }

    /// Writes a marker (call [`Self::finish`] first).
    pub(crate) fn marker(&mut self, m: u8) {
        debug_assert_eq!(self.bits, 0);
        self.out.extend_from_slice(&[0xFF, m]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_written_read_back_with_their_positions() {
        let mut out = Vec::new();
        let mut w = BitWriter::new(&mut out);
        // 0xFF bytes force stuffing.
        let items: Vec<(u32, u32)> =
            (0..200u32).map(|i| ((i.wrapping_mul(2_654_435_761)) | 0xFF00, 1 + i % 24)).collect();
        for &(v, n) in &items {
            w.put(v, n);
        }
        w.finish();
        w.marker(0xD9);
        assert!(out.windows(2).any(|p| p == [0xFF, 0x00]), "no stuffing was exercised");
        let mut r = BitReader::new(&out);
        let mut positions = Vec::new();
        for &(v, n) in &items {
            positions.push(r.pos());
            assert_eq!(r.bits(n), v & ((1 << n) - 1));
        }
        assert!(!r.overran());
        // A reader placed at any recorded position reads on from there.
        for (k, &p) in positions.iter().enumerate() {
            let mut at = BitReader::at(&out, p).unwrap();
            for &(v, n) in &items[k..] {
                assert_eq!(at.bits(n), v & ((1 << n) - 1), "from item {k}");
            }
        }
        // Reading past the marker gives zeros and says so.
        r.bits(16);
        r.bits(16);
        assert!(r.overran());
    }

    #[test]
    fn tables_decode_what_they_encode_and_grow_without_moving_codes() {
        // The standard's luminance DC table has every category; an "optimised" one lacks most.
        let spec = HuffSpec { counts: [0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], symbols: vec![3, 4, 0] };
        let grown = spec.with_symbols(0..=11).unwrap();
        assert_eq!(grown.symbols.len(), 12);
        let (old, new) = (Encoder::new(&spec).unwrap(), Encoder::new(&grown).unwrap());
        for s in [3, 4, 0] {
            assert_eq!(old.code(s), new.code(s));
        }
        let dec = Decoder::new(&grown).unwrap();
        let mut out = Vec::new();
        let mut w = BitWriter::new(&mut out);
        for s in 0..=11 {
            let (c, l) = new.code(s);
            assert!(l > 0);
            w.put(c, l);
        }
        w.finish();
        let mut r = BitReader::new(&out);
        for s in 0..=11 {
            assert_eq!(dec.decode(&mut r).map(|d| d.0), Some(s));
        }
        // A full code space has no room.
        let full = HuffSpec { counts: [2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], symbols: vec![0, 1] };
        assert!(full.with_symbols([2]).is_none());
        assert!(HuffSpec { counts: [3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], symbols: vec![0, 1, 2] }
            .codes()
            .is_none());
    }

    #[test]
    fn dc_values_round_trip_through_category_and_extra_bits() {
        for v in -2047..=2047 {
            let s = category(v);
            assert_eq!(extend(extra_bits(v, s), s), v);
        }
    }
}
