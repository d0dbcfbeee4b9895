//! Random access into ordinary JPEGs: an entropy index.
//!
//! [`crate::restart`] cuts a crop's MCUs out of a file with restart markers; most files have
//! none. One pass of Huffman decoding over a baseline file (no IDCT, no colour) records,
//! every `spacing` MCUs of each row, where the bitstream stands and the DC predictor of
//! each component: enough to start decoding at that MCU. A window is then cut out as it
//! is from a file with restart markers, with each of its rows made into a restart interval:
//! the row's bits are copied as they are, except the first DC difference of each component,
//! which is re-encoded against a predictor of 0 (what a restart resets it to). The cut file
//! has the original's tables (a DC table that lacks a category the re-encoded values need
//! gets it as a new 16-bit code, every other code unchanged), so libjpeg-turbo decodes the
//! window to exactly the pixels of the whole file.
//!
//! Only 8-bit, Huffman-coded, sequential files with one interleaved scan and no restart
//! markers are indexed; the others decode the ordinary way ([`Frame::parse`] says which).

use xxhash_rust::xxh3::xxh3_64;

use crate::huffman::{category, extend, extra_bits, BitPos, BitReader, BitWriter, Decoder, Encoder, HuffSpec};
use crate::window::{push_sof_with_size, Grid, McuWindow};

/// libjpeg's limit on the blocks of one MCU.
const MAX_BLOCKS_IN_MCU: u32 = 10;

/// One component of the scan, in scan order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ScanComponent {
    /// Blocks of this component in one MCU.
    blocks: u32,
    dc_table: u8,
    ac_table: u8,
}

/// The headers of an indexable JPEG: where its pieces are and the tables its scan uses.
#[derive(Debug, Clone)]
pub(crate) struct Frame {
    /// Start (the 0xFF) and end of the frame header (SOF) segment.
    sof: (usize, usize),
    /// Start of the scan header (SOS) segment, and of the entropy-coded data after it.
    sos: usize,
    data: usize,
    grid_mcus: Grid,
    components: Vec<ScanComponent>,
    /// The Huffman tables in force at the scan, by id.
    dc: [Option<HuffSpec>; 4],
    ac: [Option<HuffSpec>; 4],
}

fn be16(b: &[u8], i: usize) -> Option<u32> {
    Some(u32::from(u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?])))
}

impl Frame {
    /// Parses the headers of `bytes`; `None` unless it is an 8-bit, Huffman-coded,
    /// sequential JPEG with one scan holding every component, no restart interval, and at
    /// most `max_pixels` pixels.
    pub(crate) fn parse(bytes: &[u8], max_pixels: u64) -> Option<Self> {
        if bytes.get(..2)? != [0xFF, 0xD8] {
            return None;
        }
        let mut i = 2;
        let mut sof = None;
        let mut frame = None; // (width, height, [(id, h, v)], hmax, vmax)
        let (mut dc, mut ac): ([Option<HuffSpec>; 4], [Option<HuffSpec>; 4]) = Default::default();
        loop {
            while bytes.get(i) == Some(&0xFF) && bytes.get(i + 1) == Some(&0xFF) {
                i += 1;
            }
            if *bytes.get(i)? != 0xFF {
                return None;
            }
            let marker = *bytes.get(i + 1)?;
            if matches!(marker, 0x01 | 0xD0..=0xD7) {
                i += 2;
                continue;
            }
            let len = be16(bytes, i + 2)? as usize;
            let body = bytes.get(i + 4..i + 2 + len)?;
            match marker {
                0xC0 | 0xC1 => {
                    let (&precision, rest) = body.split_first()?;
                    let n = usize::from(*rest.get(4)?);
                    if precision != 8 || !(1..=4).contains(&n) || rest.len() < 5 + 3 * n || frame.is_some() {
                        return None;
                    }
                    let comps: Vec<(u8, u32, u32)> = rest[5..5 + 3 * n]
                        .chunks_exact(3)
                        .map(|c| (c[0], u32::from(c[1] >> 4), u32::from(c[1] & 15)))
                        .collect();
                    if comps.iter().any(|&(_, h, v)| !(1..=4).contains(&h) || !(1..=4).contains(&v)) {
                        return None;
                    }
                    let hmax = comps.iter().map(|c| c.1).max()?;
                    let vmax = comps.iter().map(|c| c.2).max()?;
                    frame = Some((be16(rest, 2)?, be16(rest, 0)?, comps, hmax, vmax));
                    sof = Some((i, i + 2 + len));
                }
                // Progressive, lossless, arithmetic-coded, hierarchical: not indexed.
                0xC2 | 0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF => return None,
                0xC4 => {
                    let mut rest = body;
                    while !rest.is_empty() {
                        let (class, id, spec, used) = HuffSpec::parse(rest)?;
                        let slot = match class {
                            0 => dc.get_mut(usize::from(id))?,
                            1 => ac.get_mut(usize::from(id))?,
                            _ => return None,
                        };
                        *slot = Some(spec);
                        rest = &rest[used..];
                    }
                }
                0xDD if be16(body, 0)? != 0 => return None, // restart markers: see `restart`
                0xDA => {
                    let (width, height, comps, hmax, vmax) = frame?;
                    let ns = usize::from(*body.first()?);
                    if ns != comps.len() || width == 0 || height == 0 {
                        return None;
                    }
                    if u64::from(width) * u64::from(height) > max_pixels {
                        return None;
                    }
                    let sel = body.get(1..1 + 2 * ns)?;
                    // Spectral selection 0..63 and no successive approximation: sequential.
                    if body.get(1 + 2 * ns..4 + 2 * ns)? != [0, 63, 0] {
                        return None;
                    }
                    let mut components = Vec::with_capacity(ns);
                    for s in sel.chunks_exact(2) {
                        let &(_, h, v) = comps.iter().find(|c| c.0 == s[0])?;
                        let (dc_table, ac_table) = (s[1] >> 4, s[1] & 15);
                        dc.get(usize::from(dc_table))?.as_ref()?;
                        ac.get(usize::from(ac_table))?.as_ref()?;
                        let blocks = if ns == 1 { 1 } else { h * v };
                        components.push(ScanComponent { blocks, dc_table, ac_table });
                    }
                    if components.iter().map(|c| c.blocks).sum::<u32>() > MAX_BLOCKS_IN_MCU {
                        return None;
                    }
                    // One component: the MCU is one 8x8 block, whatever its sampling factors.
                    let mcu = if ns == 1 { (8, 8) } else { (8 * hmax, 8 * vmax) };
                    return Some(Self {
                        sof: sof?,
                        sos: i,
                        data: i + 2 + len,
                        grid_mcus: Grid::new(width, height, mcu, 1),
                        components,
                        dc,
                        ac,
                    });
                }
                0xD9 => return None,
                _ => {}
            }
            i += 2 + len;
        }
    }

    /// Where the entropy-coded data starts in the file.
    pub(crate) fn data_offset(&self) -> usize {
        self.data
    }

    /// The MCU grid with cuts starting every `spacing` MCUs.
    pub(crate) fn grid(&self, spacing: u32) -> Grid {
        Grid { step: spacing, ..self.grid_mcus }
    }

    fn decoders(&self) -> Option<Vec<(Decoder, Decoder)>> {
        self.components
            .iter()
            .map(|c| {
                let dc = self.dc[usize::from(c.dc_table)].as_ref()?;
                // libjpeg refuses a DC table with a category above 15.
                if dc.symbols.iter().any(|&s| s > 15) {
                    return None;
                }
                Some((Decoder::new(dc)?, Decoder::new(self.ac[usize::from(c.ac_table)].as_ref()?)?))
            })
            .collect()
    }
}

/// Where decoding can start: the bit and the DC predictor of each scan component.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Point {
    pub bit: u32,
    pub byte: u32,
    pub dc: [i16; 4],
}

impl Point {
    fn new(pos: BitPos, dc: [i32; 4]) -> Option<Self> {
        let mut out = [0i16; 4];
        for (o, v) in out.iter_mut().zip(dc) {
            *o = i16::try_from(v).ok()?;
        }
        Some(Self { bit: u32::try_from(pos.bit).ok()?, byte: u32::try_from(pos.byte).ok()?, dc: out })
    }

    fn pos(&self) -> BitPos {
        BitPos { bit: u64::from(self.bit), byte: u64::from(self.byte) }
    }
}

/// The index of one file: a [`Point`] at every `spacing`-th MCU of every row, then one at
/// the end of the data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntropyIndex {
    pub(crate) spacing: u32,
    pub(crate) mcus: (u32, u32),
    pub(crate) points: Vec<Point>,
    /// Components of the scan (the DC predictors a point holds).
    pub(crate) components: u8,
}

/// Decodes one MCU, keeping only the DC predictors; with `out`, writes it back, the first
/// DC difference of each component re-encoded against a predictor of 0 with `out`'s
/// encoders.
#[inline]
fn decode_mcu(
    r: &mut BitReader<'_>,
    frame: &Frame,
    tables: &[(Decoder, Decoder)],
    dc: &mut [i32; 4],
    mut out: Option<(&mut BitWriter<'_>, &[Encoder])>,
) -> Option<()> {
    for (ci, (c, (dct, act))) in frame.components.iter().zip(tables).enumerate() {
        for b in 0..c.blocks {
            let (s, code, len) = dct.decode(r)?;
            let s = u32::from(s);
            let bits = r.bits(s);
            dc[ci] = dc[ci].checked_add(extend(bits, s))?;
            if let Some((w, enc)) = out.as_mut() {
                if b == 0 {
                    let v = dc[ci];
                    let cat = category(v);
                    let (code, len) = enc[ci].code(u8::try_from(cat).ok()?);
                    if len == 0 {
                        return None;
                    }
                    w.put(code, len);
                    w.put(extra_bits(v, cat), cat);
                } else {
                    w.put(code, len);
                    w.put(bits, s);
                }
            }
            // The AC coefficients, read as libjpeg reads them.
            let mut k = 1;
            while k < 64 {
                let (rs, code, len) = act.decode(r)?;
                let (run, s) = (u32::from(rs >> 4), u32::from(rs & 15));
                let bits = r.bits(s);
                if let Some((w, _)) = out.as_mut() {
                    w.put(code, len);
                    w.put(bits, s);
                }
                if s != 0 {
                    k += run;
                } else if run != 15 {
                    break;
                } else {
                    k += 15;
                }
                k += 1;
            }
        }
    }
    Some(())
}

impl EntropyIndex {
    /// Indexes the scan of `bytes` (whose headers are `frame`), a point every `spacing`
    /// MCUs; `None` when the data is damaged (a code no table holds, or the data ends
    /// before the last MCU): the ordinary decoder then reports it.
    pub(crate) fn build(bytes: &[u8], frame: &Frame, spacing: u32) -> Option<Self> {
        let spacing = spacing.max(1);
        let (cols, rows) = frame.grid_mcus.mcus;
        let tables = frame.decoders()?;
        let data = bytes.get(frame.data..)?;
        let mut r = BitReader::new(data);
        let mut dc = [0i32; 4];
        let per_row = cols.div_ceil(spacing) as usize;
        let mut points = Vec::with_capacity(per_row * rows as usize + 1);
        for _ in 0..rows {
            for col in 0..cols {
                if col % spacing == 0 {
                    points.push(Point::new(r.pos(), dc)?);
                }
                decode_mcu(&mut r, frame, &tables, &mut dc, None)?;
            }
            if r.overran() {
                return None;
            }
        }
        points.push(Point::new(r.pos(), dc)?);
        Some(Self { spacing, mcus: (cols, rows), points, components: frame.components.len() as u8 })
    }

    /// Bytes this index holds in memory.
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.points.len() * std::mem::size_of::<Point>()
    }

    /// The point where row `row`'s MCU `col` starts (`col` a multiple of the spacing, or
    /// the row's end).
    fn point(&self, row: u32, col: u32) -> Option<&Point> {
        let per_row = self.mcus.0.div_ceil(self.spacing);
        let k = if col >= self.mcus.0 { (row + 1) * per_row } else { row * per_row + col / self.spacing };
        self.points.get(k as usize)
    }

    /// Writes into `out` a JPEG of just the MCUs of `w`: the headers with the window's size
    /// and a restart interval of one window row, DC tables grown where the re-encoded
    /// differences need it, then each row's bits. `None` when the data does not match the
    /// index (a damaged index, or a DC value the tables cannot encode).
    pub(crate) fn write_window(&self, bytes: &[u8], frame: &Frame, w: McuWindow, out: &mut Vec<u8>) -> Option<()> {
        let grid = frame.grid(self.spacing);
        let tables = frame.decoders()?;
        // Every category a DC value of 8-bit data can have, added where a table lacks one.
        let mut grown: [Option<HuffSpec>; 4] = Default::default();
        for c in &frame.components {
            let id = usize::from(c.dc_table);
            let spec = frame.dc[id].as_ref()?;
            if grown[id].is_none() && !(0..=11).all(|s| spec.symbols.contains(&s)) {
                grown[id] = spec.with_symbols(0..=11);
            }
        }
        let encoders: Vec<Encoder> = frame
            .components
            .iter()
            .map(|c| {
                let id = usize::from(c.dc_table);
                Encoder::new(grown[id].as_ref().or(frame.dc[id].as_ref())?)
            })
            .collect::<Option<_>>()?;

        out.clear();
        out.extend_from_slice(&bytes[..frame.sof.0]);
        push_sof_with_size(out, &bytes[frame.sof.0..frame.sof.1], grid.pixels(w));
        out.extend_from_slice(&bytes[frame.sof.1..frame.sos]);
        for (id, spec) in grown.iter().enumerate() {
            if let Some(spec) = spec {
                out.extend_from_slice(&spec.segment(0, id as u8));
            }
        }
        out.extend_from_slice(&[0xFF, 0xDD, 0, 4]);
        out.extend_from_slice(&((w.c1 - w.c0) as u16).to_be_bytes());
        out.extend_from_slice(&bytes[frame.sos..frame.data]);

        let data = bytes.get(frame.data..)?;
        let mut bw = BitWriter::new(out);
        for (k, row) in (w.r0..w.r1).enumerate() {
            if k > 0 {
                bw.finish();
                bw.marker(0xD0 + ((k - 1) % 8) as u8);
            }
            let (start, end) = (self.point(row, w.c0)?, self.point(row, w.c1)?);
            let mut r = BitReader::at(data, start.pos())?;
            let mut dc = start.dc.map(i32::from);
            // The first MCU written again with its DC differences against 0...
            decode_mcu(&mut r, frame, &tables, &mut dc, Some((&mut bw, &encoders)))?;
            // ...then the rest of the row as it is.
            let rest = u64::from(end.bit).checked_sub(r.pos().bit)?;
            bw.copy(&mut r, rest);
            if r.overran() {
                return None;
            }
        }
        bw.finish();
        bw.marker(0xD9);
        Some(())
    }
}

/// The first bytes of a stored index, then its format's version.
const MAGIC: &[u8; 4] = b"SLIX";
const VERSION: u8 = 1;

fn push_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn read_varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7F) << shift;
        if byte < 0x80 {
            return Some(v);
        }
    }
    None
}

fn zigzag(v: i32) -> u64 {
    u64::from(((v << 1) ^ (v >> 31)) as u32)
}

fn unzigzag(v: u64) -> Option<i32> {
    let v = u32::try_from(v).ok()?;
    Some((v >> 1) as i32 ^ -((v & 1) as i32))
}

impl EntropyIndex {
    /// The index as stored on disk: a header, the points as varint deltas, and a checksum
    /// of all that (xxh3-64), so a damaged file is refused, never used.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24 + self.points.len() * 6);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        for v in [self.spacing, self.mcus.0, self.mcus.1, u32::from(self.components)] {
            push_varint(&mut out, u64::from(v));
        }
        let mut prev = Point::default();
        for p in &self.points {
            // The byte follows from the bit but for the stuffed bytes before it: store those.
            push_varint(&mut out, u64::from(p.bit - prev.bit));
            push_varint(&mut out, u64::from((p.byte - p.bit / 8) - (prev.byte - prev.bit / 8)));
            for (d, q) in p.dc.iter().zip(prev.dc).take(usize::from(self.components)) {
                push_varint(&mut out, zigzag(i32::from(*d) - i32::from(q)));
            }
            prev = *p;
        }
        let sum = xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Reads back what [`Self::to_bytes`] wrote, for a file with `frame`'s headers; `None`
    /// for anything else: another format or version, a checksum that does not match, an
    /// index for another image, points out of order or beyond `data_len` bytes of data.
    pub(crate) fn from_bytes(b: &[u8], frame: &Frame, data_len: usize) -> Option<Self> {
        let (body, sum) = b.split_at_checked(b.len().checked_sub(8)?)?;
        if xxh3_64(body).to_le_bytes() != sum || body.get(..4)? != MAGIC || *body.get(4)? != VERSION {
            return None;
        }
        let mut at = 5;
        let mut next = || read_varint(body, &mut at).and_then(|v| u32::try_from(v).ok());
        let (spacing, cols, rows, components) = (next()?, next()?, next()?, next()?);
        if spacing == 0 || (cols, rows) != frame.grid_mcus.mcus || components as usize != frame.components.len() {
            return None;
        }
        let n = cols.div_ceil(spacing) as usize * rows as usize + 1;
        let mut points = Vec::with_capacity(n);
        let mut p = Point::default();
        for _ in 0..n {
            let (bits, stuffed) = (next()?, next()?);
            let stuffed = (p.byte - p.bit / 8).checked_add(stuffed)?;
            p.bit = p.bit.checked_add(bits)?;
            p.byte = (p.bit / 8).checked_add(stuffed)?;
            for d in p.dc.iter_mut().take(components as usize) {
                let delta = unzigzag(u64::from(next()?))?;
                *d = i16::try_from(i32::from(*d).checked_add(delta)?).ok()?;
            }
            // A bit lies in its byte or after it (stuffing only adds bytes).
            if u64::from(p.byte) > data_len as u64 || u64::from(p.bit) / 8 > u64::from(p.byte) {
                return None;
            }
            points.push(p);
        }
        (at == body.len()).then_some(Self { spacing, mcus: (cols, rows), points, components: components as u8 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::{encode_jpeg_progressive, encode_jpeg_with, SourcePixels};
    use crate::jpeg::tests::test_rgb;
    use crate::jpeg::{JpegDecoder, Subsampling};

    const LIMIT: u64 = 1 << 26;

    fn jpeg(w: u32, h: u32, s: Subsampling) -> Vec<u8> {
        match s {
            Subsampling::Gray => {
                let gray: Vec<u8> = test_rgb(w, h).chunks_exact(3).map(|p| p[0]).collect();
                encode_jpeg_with(&gray, w, h, SourcePixels::Gray, s, 92).unwrap()
            }
            _ => encode_jpeg_with(&test_rgb(w, h), w, h, SourcePixels::Rgb, s, 92).unwrap(),
        }
    }

    fn full(bytes: &[u8]) -> (Vec<u8>, u32, u32) {
        let mut d = JpegDecoder::new(LIMIT).unwrap();
        let mut out = Vec::new();
        let (w, h) = d.decode_full(bytes, &mut out).unwrap();
        (out, w, h)
    }

    #[test]
    fn every_window_cut_with_the_index_decodes_to_the_pixels_of_the_whole_file() {
        let subsamplings = [
            Subsampling::S420,
            Subsampling::S422,
            Subsampling::S444,
            Subsampling::S440,
            Subsampling::S411,
            Subsampling::Gray,
        ];
        for (w, h) in [(203, 157), (64, 48), (17, 300)] {
            for s in subsamplings {
                let file = jpeg(w, h, s);
                let frame = Frame::parse(&file, LIMIT).unwrap_or_else(|| panic!("{s:?}: not indexable"));
                let (whole, fw, _) = full(&file);
                for spacing in [1, 2, 3, 4] {
                    let index = EntropyIndex::build(&file, &frame, spacing).unwrap();
                    let grid = frame.grid(spacing);
                    let mut cut = Vec::new();
                    // Every window of whole MCUs on the spacing.
                    for c0 in (0..grid.mcus.0).step_by(spacing as usize) {
                        for c1 in [c0 + 1, c0 + spacing, grid.mcus.0] {
                            let c1 = c1.min(grid.mcus.0);
                            for (r0, r1) in [(0, 1), (1, grid.mcus.1), (grid.mcus.1 / 2, grid.mcus.1 / 2 + 2)] {
                                let r1 = r1.min(grid.mcus.1);
                                if r0 >= r1 || (c1 % spacing != 0 && c1 != grid.mcus.0) {
                                    continue;
                                }
                                let win = McuWindow { c0, c1, r0, r1 };
                                index.write_window(&file, &frame, win, &mut cut).unwrap();
                                let (got, gw, gh) = full(&cut);
                                assert_eq!((gw, gh), grid.pixels(win), "{s:?} {win:?}");
                                let (ox, oy) = grid.origin(win);
                                // Away from the window's edges the pixels are the whole file's
                                // (at the edges the upsampler sees other neighbours: callers
                                // cut a margin, see `JpegDecoder::cut_window`).
                                let (m, n) = (grid.mcu.0, grid.mcu.1);
                                for y in n.min(gh)..gh.saturating_sub(n) {
                                    for x in m.min(gw)..gw.saturating_sub(m) {
                                        let a = ((y * gw + x) * 3) as usize;
                                        let b = (((oy + y) * fw + ox + x) * 3) as usize;
                                        assert_eq!(got[a..a + 3], whole[b..b + 3], "{s:?} {w}x{h} {win:?} ({x},{y})");
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_stored_index_reads_back_and_a_damaged_one_is_refused() {
        let file = jpeg(203, 157, Subsampling::S420);
        let frame = Frame::parse(&file, LIMIT).unwrap();
        let data_len = file.len() - frame.data;
        let index = EntropyIndex::build(&file, &frame, 2).unwrap();
        let stored = index.to_bytes();
        assert_eq!(EntropyIndex::from_bytes(&stored, &frame, data_len).as_ref(), Some(&index));
        // Small: a few bytes a point (this smooth test image is tiny: on photos of ~100 KB
        // the index is ~1 % of the file, BENCHMARKS.md).
        let per_point = stored.len() as f64 / index.points.len() as f64;
        assert!(per_point < 9.0, "{per_point} bytes a point");
        // Every flipped byte and every truncation is caught (the checksum, then the bounds).
        for k in 0..stored.len() {
            let mut bad = stored.clone();
            bad[k] ^= 0x41;
            assert!(EntropyIndex::from_bytes(&bad, &frame, data_len).is_none(), "byte {k} flipped");
            assert!(EntropyIndex::from_bytes(&stored[..k], &frame, data_len).is_none(), "cut at {k}");
        }
        // Another image's index, even with a valid checksum, does not fit.
        let other = jpeg(64, 48, Subsampling::S420);
        let other_frame = Frame::parse(&other, LIMIT).unwrap();
        assert!(EntropyIndex::from_bytes(&stored, &other_frame, other.len()).is_none());
    }

    #[test]
    fn files_the_index_cannot_serve_are_refused() {
        let (w, h) = (96, 64);
        assert!(Frame::parse(&encode_jpeg_progressive(&test_rgb(w, h), w, h, 90).unwrap(), LIMIT).is_none());
        let packed = crate::transcode::add_restart_markers(&jpeg(w, h, Subsampling::S420), 2, LIMIT).unwrap();
        assert!(Frame::parse(&packed, LIMIT).is_none(), "restart markers: `restart` cuts it");
        let file = jpeg(w, h, Subsampling::S420);
        assert!(Frame::parse(&file, 100).is_none(), "too many pixels");
        // Truncated data: the headers parse, the index does not build.
        let truncated = &file[..file.len() * 2 / 3];
        let frame = Frame::parse(truncated, LIMIT).unwrap();
        assert!(EntropyIndex::build(truncated, &frame, 2).is_none());
    }
}
