//! Random access into JPEGs that carry restart markers.
//!
//! Huffman decoding is sequential: to reach the rows of a crop, libjpeg-turbo must
//! entropy-decode every MCU above them, and every MCU left and right of the crop in its rows
//! (on ~100 KB photos that is ~70% of the decode time). A restart marker (RSTn) resets the
//! entropy coder and the DC predictors, so the data between two markers decodes on its own.
//! When the restart interval divides the MCU row, each interval is a strip of MCUs of one
//! row, and the MCUs of any window can be cut out and stitched into a smaller, valid JPEG:
//! same tables, the window's width and height, the strips of each row one after the other,
//! markers renumbered. Decoding that costs what the window costs, not what the image above
//! and beside it costs.
//!
//! Datasets get restart markers losslessly from `sluice pack` (see
//! [`crate::transcode::add_restart_markers`]); files without them decode the ordinary way.

use memchr::memchr_iter;

use crate::window::{push_sof_with_size, Grid, McuWindow};

/// Where the pieces of a seekable JPEG are, from one pass over its markers and data.
#[derive(Debug)]
pub(crate) struct RestartLayout {
    /// Start (the 0xFF) and end of the frame header (SOF) segment.
    sof: (usize, usize),
    /// Where the entropy-coded data begins (after the scan header).
    data: usize,
    /// The MCUs; a cut starts at an interval (`grid.step`, which divides the MCU row).
    grid: Grid,
    /// Byte range of every interval's entropy-coded data (markers excluded), in order.
    segments: Vec<(usize, usize)>,
}

fn be16(b: &[u8], i: usize) -> Option<u32> {
    Some(u32::from(u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?])))
}

impl RestartLayout {
    /// Parses `bytes`; `None` unless it is an 8-bit, Huffman-coded, sequential JPEG with a
    /// single scan holding every component, a restart interval that divides the MCU row, and
    /// exactly as many intervals as the image needs (so a truncated or damaged file is left
    /// to the ordinary decoder, which reports it), and at most `max_pixels` pixels. Memory
    /// stays proportional to the intervals the image needs, whatever the file holds.
    pub(crate) fn parse(bytes: &[u8], max_pixels: u64) -> Option<Self> {
        if bytes.get(..2)? != [0xFF, 0xD8] {
            return None;
        }
        let mut i = 2;
        let mut sof = None;
        let mut frame = None; // (width, height, components, hmax, vmax)
        let mut interval = 0;
        loop {
            while bytes.get(i) == Some(&0xFF) && bytes.get(i + 1) == Some(&0xFF) {
                i += 1;
            }
            if *bytes.get(i)? != 0xFF {
                return None;
            }
            let marker = *bytes.get(i + 1)?;
            if matches!(marker, 0x01 | 0xD0..=0xD7) {
                i += 2; // standalone markers carry no length
                continue;
            }
            let len = be16(bytes, i + 2)? as usize;
            let body = bytes.get(i + 4..i + 2 + len)?;
            match marker {
                // Baseline or extended sequential, Huffman-coded.
                0xC0 | 0xC1 => {
                    let (&precision, rest) = body.split_first()?;
                    let n = usize::from(*rest.get(4)?);
                    if precision != 8 || n == 0 || rest.len() < 5 + 3 * n {
                        return None;
                    }
                    let comps = &rest[5..5 + 3 * n];
                    let hmax = comps.chunks_exact(3).map(|c| u32::from(c[1] >> 4)).max()?;
                    let vmax = comps.chunks_exact(3).map(|c| u32::from(c[1] & 15)).max()?;
                    frame = Some((be16(rest, 2)?, be16(rest, 0)?, n, hmax.max(1), vmax.max(1)));
                    sof = Some((i, i + 2 + len));
                }
                // Progressive, lossless, arithmetic-coded, hierarchical: not seekable here.
                0xC2 | 0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF => return None,
                0xDD => interval = be16(body, 0)?,
                0xDA => {
                    let (width, height, n, hmax, vmax) = frame?;
                    if usize::from(*body.first()?) != n || interval == 0 || width == 0 || height == 0 {
                        return None;
                    }
                    if u64::from(width) * u64::from(height) > max_pixels {
                        return None; // the ordinary decoder reports it as too large
                    }
                    // One component: the MCU is one 8x8 block, whatever its sampling factors.
                    let mcu = if n == 1 { (8, 8) } else { (8 * hmax, 8 * vmax) };
                    let grid = Grid::new(width, height, mcu, interval);
                    if !grid.mcus.0.is_multiple_of(interval) {
                        return None;
                    }
                    let data = i + 2 + len;
                    let expected = (grid.mcus.0 / interval) as usize * grid.mcus.1 as usize;
                    let segments = scan_segments(bytes, data, expected)?;
                    return (segments.len() == expected).then_some(Self { sof: sof?, data, grid, segments });
                }
                0xD9 => return None,
                _ => {}
            }
            i += 2 + len;
        }
    }

    pub(crate) fn grid(&self) -> &Grid {
        &self.grid
    }

    /// Writes into `out` a JPEG of just the MCUs of `w`: the header with the window's size,
    /// then the window's intervals, row by row, with restart markers renumbered from RST0.
    pub(crate) fn write_window(&self, bytes: &[u8], w: McuWindow, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&bytes[..self.sof.0]);
        push_sof_with_size(out, &bytes[self.sof.0..self.sof.1], self.grid.pixels(w));
        out.extend_from_slice(&bytes[self.sof.1..self.data]);
        let interval = self.grid.step;
        let per_row = self.grid.mcus.0 / interval;
        let (s0, s1) = (w.c0 / interval, w.c1 / interval);
        let mut n = 0u8;
        for row in w.r0..w.r1 {
            for s in s0..s1 {
                if n > 0 || row > w.r0 || s > s0 {
                    out.extend_from_slice(&[0xFF, 0xD0 + n % 8]);
                    n = n.wrapping_add(1);
                }
                let (a, b) = self.segments[(row * per_row + s) as usize];
                out.extend_from_slice(&bytes[a..b]);
            }
        }
        out.extend_from_slice(&[0xFF, 0xD9]);
    }
}

/// The byte ranges of the restart intervals of the scan starting at `data`, up to the first
/// marker that is not RSTn (normally EOI). `None` when the data ends without one, or holds
/// more than `expected` intervals (checked as they come: a crafted file may hold millions).
fn scan_segments(bytes: &[u8], data: usize, expected: usize) -> Option<Vec<(usize, usize)>> {
    let mut segments = Vec::new();
    let mut start = data;
    let tail = &bytes[data..];
    let mut skip_to = 0;
    for k in memchr_iter(0xFF, tail) {
        if k < skip_to {
            continue;
        }
        match *tail.get(k + 1)? {
            0x00 => skip_to = k + 2, // a stuffed 0xFF data byte
            0xFF => {}               // fill before a marker: the marker is judged at the last 0xFF
            0xD0..=0xD7 => {
                if segments.len() + 1 >= expected {
                    return None; // this interval and the one after it are too many
                }
                segments.push((start, data + first_fill(tail, k)));
                start = data + k + 2;
                skip_to = k + 2;
            }
            _ => {
                segments.push((start, data + first_fill(tail, k)));
                return Some(segments);
            }
        }
    }
    None
}

/// The first of the 0xFF bytes that end at `k` (fill bytes may precede a marker).
fn first_fill(tail: &[u8], mut k: usize) -> usize {
    while k > 0 && tail[k - 1] == 0xFF {
        k -= 1;
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::{encode_jpeg_progressive, encode_jpeg_with, SourcePixels};
    use crate::jpeg::tests::{patch_sof_dims, test_rgb};
    use crate::jpeg::{JpegDecoder, Subsampling};
    use crate::resize::SubRect;
    use crate::transcode::{add_restart_markers, restart_interval_for};

    const LIMIT: u64 = 1 << 26;

    fn jpeg(w: u32, h: u32, s: Subsampling) -> Vec<u8> {
        if s == Subsampling::Gray {
            let gray: Vec<u8> = test_rgb(w, h).chunks_exact(3).map(|p| p[0]).collect();
            encode_jpeg_with(&gray, w, h, SourcePixels::Gray, s, 92).unwrap()
        } else {
            encode_jpeg_with(&test_rgb(w, h), w, h, SourcePixels::Rgb, s, 92).unwrap()
        }
    }

    /// A tiny deterministic generator for crop windows.
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self, n: u32) -> f64 {
            self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((self.0 >> 33) % u64::from(n.max(1) * 16)) as f64 / 16.0
        }
    }

    #[test]
    fn packing_is_lossless_and_makes_the_file_seekable() {
        let (w, h) = (203, 157);
        for s in [Subsampling::S420, Subsampling::S422, Subsampling::S444, Subsampling::Gray] {
            let plain = jpeg(w, h, s);
            assert!(RestartLayout::parse(&plain, LIMIT).is_none(), "{s:?}: no restart markers yet");
            let packed = add_restart_markers(&plain, 2, LIMIT).unwrap();
            let layout = RestartLayout::parse(&packed, LIMIT).unwrap_or_else(|| panic!("{s:?}: not seekable"));
            assert_eq!((layout.grid().width, layout.grid().height), (w, h));
            let mut d = JpegDecoder::new(LIMIT).unwrap();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            d.decode_full(&plain, &mut a).unwrap();
            d.decode_full(&packed, &mut b).unwrap();
            assert!(a == b, "{s:?}: packing changed pixels");
        }
    }

    #[test]
    fn a_window_cut_from_a_seekable_jpeg_decodes_to_exactly_the_same_pixels() {
        let (w, h) = (203, 157); // partial MCUs on the right and bottom edges
        let subsamplings = [
            Subsampling::S420,
            Subsampling::S422,
            Subsampling::S444,
            Subsampling::S440,
            Subsampling::S411,
            Subsampling::Gray,
        ];
        let mut rng = Lcg(7);
        for s in subsamplings {
            for interval in [1, 2, 4] {
                let packed = add_restart_markers(&jpeg(w, h, s), interval, LIMIT).unwrap();
                assert!(RestartLayout::parse(&packed, LIMIT).is_some(), "{s:?}/{interval}");
                let mut d = JpegDecoder::new(LIMIT).unwrap();
                let (mut window, mut cut, mut whole) = (Vec::new(), Vec::new(), Vec::new());
                let mut cuts = 0;
                for i in 0..300 {
                    let (cw, ch) = (1.0 + rng.next(w - 1), 1.0 + rng.next(h - 1));
                    let rect =
                        SubRect { left: rng.next(w - cw as u32), top: rng.next(h - ch as u32), width: cw, height: ch };
                    // Targets from 1/8 of the window up to its size: every DCT scale.
                    let k = [8.0, 4.0, 2.0, 1.0][i % 4];
                    let target = (((cw / k) as u32).max(1), ((ch / k) as u32).max(1));
                    let Some(shifted) = d.cut_window(&packed, rect, target, &mut window) else {
                        continue; // the window needs the whole image: nothing to cut
                    };
                    let got = d.decode_region_in_place((&window, shifted), target, &mut cut).unwrap();
                    cuts += 1;
                    let want = d.decode_region_in_place((&packed, rect), target, &mut whole).unwrap();
                    assert_eq!(got.scale_denom, want.scale_denom, "{s:?}/{interval} {rect:?}");
                    let (gx, gy) = (got.rect.left, got.rect.top);
                    let (wx, wy) = (want.rect.left, want.rect.top);
                    // Same window content: compare the pixels the rectangles point at.
                    let px = |buf: &[u8], bw: u32, x: f64, y: f64, dx: u32, dy: u32| {
                        let (xx, yy) = (x.floor() as u32 + dx, y.floor() as u32 + dy);
                        let i = ((yy * bw + xx) * 3) as usize;
                        [buf[i], buf[i + 1], buf[i + 2]]
                    };
                    assert!((gx.fract() - wx.fract()).abs() < 1e-9 && (gy.fract() - wy.fract()).abs() < 1e-9);
                    let (rw, rh) = (got.rect.width.ceil() as u32, got.rect.height.ceil() as u32);
                    for dy in 0..rh.min(got.height - gy.floor() as u32) {
                        for dx in 0..rw.min(got.width - gx.floor() as u32) {
                            assert_eq!(
                                px(&cut, got.width, gx, gy, dx, dy),
                                px(&whole, want.width, wx, wy, dx, dy),
                                "{s:?}/{interval} {rect:?} target {target:?} at ({dx},{dy})"
                            );
                        }
                    }
                }
                assert!(cuts >= 20, "{s:?}/{interval}: only {cuts} of 40 windows were cut");
            }
        }
    }

    #[test]
    fn files_that_cannot_be_cut_are_left_to_the_ordinary_decoder() {
        let (w, h) = (96, 64);
        let progressive = encode_jpeg_progressive(&test_rgb(w, h), w, h, 90).unwrap();
        assert!(RestartLayout::parse(&progressive, LIMIT).is_none());
        let packed = add_restart_markers(&jpeg(w, h, Subsampling::S420), 1, LIMIT).unwrap();
        // Truncated: too few intervals, so not seekable, and the decoder reports it.
        let truncated = &packed[..packed.len() * 2 / 3];
        assert!(RestartLayout::parse(truncated, LIMIT).is_none());
        let mut d = JpegDecoder::new(LIMIT).unwrap();
        let rect = SubRect { left: 40.0, top: 30.0, width: 30.0, height: 20.0 };
        assert!(d.decode_region(truncated, rect, (30, 20), &mut Vec::new()).is_err());
        // Packing refuses damaged input instead of writing a "repaired" copy.
        assert!(add_restart_markers(&packed[..packed.len() / 2], 1, LIMIT).is_err());
        assert!(add_restart_markers(&[], 1, LIMIT).is_err());
        assert!(add_restart_markers(b"not a jpeg at all", 1, LIMIT).is_err());
        assert!(matches!(add_restart_markers(&packed, 1, 100), Err(crate::CodecError::TooLarge { .. })));
    }

    #[test]
    fn a_flood_of_restart_markers_is_refused_without_collecting_them() {
        let packed = add_restart_markers(&jpeg(16, 16, Subsampling::S444), 1, LIMIT).unwrap();
        assert!(RestartLayout::parse(&packed, LIMIT).is_some());
        // Four million more RST markers before EOI (8 MiB). Collecting every one before
        // comparing the count held 16 bytes per marker: ~2 GiB per thread on a 256 MiB file.
        let declared = |jpg: &[u8], w, h| {
            let mut jpg = jpg.to_vec();
            patch_sof_dims(&mut jpg, w, h);
            jpg
        };
        let flood = |header: &[u8]| {
            let mut f = header[..header.len() - 2].to_vec();
            f.extend((0..4_000_000u32).flat_map(|k| [0xFF, 0xD0 + (k % 8) as u8]));
            f.extend_from_slice(&[0xFF, 0xD9]);
            f
        };
        for (what, file) in [
            ("a 16x16 image", flood(&packed)),
            // A header claiming more pixels than allowed needs no scan at all.
            ("a 65535x65535 header", flood(&declared(&packed, 65_535, 65_535))),
        ] {
            let (layout, peak) = crate::alloc_probe::peak_bytes_during(|| RestartLayout::parse(&file, LIMIT));
            assert!(layout.is_none(), "{what}");
            assert!(peak < 64 << 10, "{what}: parsing held {peak} bytes");
        }
    }

    #[test]
    fn windows_align_to_intervals_and_stay_inside_the_image() {
        let packed = add_restart_markers(&jpeg(203, 157, Subsampling::S420), 4, LIMIT).unwrap();
        let l = RestartLayout::parse(&packed, LIMIT).unwrap();
        assert_eq!((l.grid.mcus, l.grid.step), ((13, 10), 1)); // 13 MCUs a row: only 1 divides it
        let packed = add_restart_markers(&jpeg(256, 64, Subsampling::S420), 4, LIMIT).unwrap();
        let l = *RestartLayout::parse(&packed, LIMIT).unwrap().grid();
        assert_eq!((l.mcus, l.step), ((16, 4), 4));
        let win = l.window_covering(70, 20, 130, 40);
        assert_eq!(win, McuWindow { c0: 4, c1: 12, r0: 1, r1: 3 });
        assert_eq!(l.origin(win), (64, 16));
        assert!(l.is_whole(l.window_covering(0, 0, 256, 64)));
        assert_eq!(l.window_covering(250, 60, 999, 999), McuWindow { c0: 12, c1: 16, r0: 3, r1: 4 });
        assert_eq!((restart_interval_for(32, 4), restart_interval_for(30, 4), restart_interval_for(7, 4)), (4, 3, 1));
    }
}
