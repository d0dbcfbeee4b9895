//! COCO segmentations painted into a semantic mask, when a sample is loaded.
//!
//! The stated rule: a `width x height` canvas of zeros; each object, in annotation order,
//! sets its pixels to its class id (a later object covers an earlier one). An RLE sets
//! exactly its runs (as pycocotools decodes them: column-major, starting with zeros). A
//! polygon sets the pixels whose centre `(x + 0.5, y + 0.5)` lies inside it (even-odd
//! rule; an object's polygons are unioned). pycocotools rasterises polygons differently at
//! their edges (it walks the outline on a 5x finer grid), so a polygon's edge pixels may
//! differ from its masks by one pixel; interiors are the same.
//!
//! Painting is bounded before it starts: the mask's declared size must be the decoded
//! image's (the loader checks it from the image's header), a polygon is filled by an edge
//! table (each row sees only the edges that cross it), and one object's steps (edge
//! crossings, runs, pixels set) may not pass `limits.max_pixels`, nor a sample's
//! [`PAINT_WORK_PER_SAMPLE`] times that.

use sluice_core::{Mask, Segmentation};

/// How much painting one sample's mask may cost, in elementary steps (a pixel set, an
/// edge crossing a scan line, an RLE run), as a multiple of `limits.max_pixels`: about
/// what decoding that many images costs. One object may cost at most `max_pixels`.
pub const PAINT_WORK_PER_SAMPLE: u64 = 4;

/// Paints `objects` onto a `width x height` mask; says what is wrong with a malformed one,
/// or one whose painting would cost more than the bounds ([`PAINT_WORK_PER_SAMPLE`]),
/// before painting it. The caller checks `width x height` against the decoded image first.
pub fn paint(width: u32, height: u32, objects: &[(u8, Segmentation)], max_pixels: u64) -> Result<Mask, String> {
    let n = u64::from(width) * u64::from(height);
    if n > max_pixels {
        return Err(format!("a {width}x{height} mask is over the limit of {max_pixels} pixels (limits.max_pixels)"));
    }
    let per_sample = max_pixels.saturating_mul(PAINT_WORK_PER_SAMPLE);
    let mut data = vec![0u8; n as usize];
    let mut spent = 0u64;
    let mut edges = Vec::new();
    for (i, (class, seg)) in objects.iter().enumerate() {
        let fail = |why: String| format!("segmentation of object {i}: {why}");
        let decoded;
        let work = match seg {
            Segmentation::Polygons(polys) => {
                for p in polys {
                    if p.len() < 6 || p.len() % 2 != 0 || !p.iter().all(|v| v.is_finite()) {
                        return Err(fail(format!("a polygon of {} numbers (needs x, y pairs, 3 or more)", p.len())));
                    }
                }
                Work::Polygons(polys)
            }
            Segmentation::Rle { counts, size } => Work::Runs(counts, *size),
            Segmentation::RleString { counts, size } => {
                decoded = decode_counts(counts).map_err(fail)?;
                Work::Runs(&decoded, *size)
            }
        };
        let cost = match work {
            Work::Polygons(polys) => polygon_edges(polys, height, &mut edges),
            Work::Runs(counts, size) => run_cost(counts, size, width, height).map_err(fail)?,
        };
        if cost > max_pixels {
            return Err(fail(format!(
                "painting it takes {cost} steps, over the limit of {max_pixels} an object (limits.max_pixels)"
            )));
        }
        spent += cost;
        if spent > per_sample {
            return Err(fail(format!(
                "painting the sample's objects up to this one takes {spent} steps, over the limit of \
                 {per_sample} a sample ({PAINT_WORK_PER_SAMPLE} x limits.max_pixels)"
            )));
        }
        match work {
            Work::Polygons(_) => fill_edges(&mut data, width, &mut edges, *class),
            Work::Runs(counts, _) => paint_runs(&mut data, width, height, counts, *class),
        }
    }
    Ok(Mask { width, height, data })
}

/// One object's segmentation, its RLE counts decoded.
#[derive(Clone, Copy)]
enum Work<'a> {
    Polygons(&'a [Vec<f64>]),
    Runs(&'a [u32], [u32; 2]),
}

/// An edge of a polygon as the scan lines see it: the rows whose centres it crosses
/// (`first..end`), and its ends as written (the crossing is computed from them, in this
/// order, so that every crossing is the one the even-odd rule defines).
#[derive(Debug, Clone, Copy)]
struct Edge {
    polygon: u32,
    first: u32,
    end: u32,
    x0: f64,
    y0: f64,
    x1: f64,
    y1: f64,
}

/// The rows `y` in `0..height` whose centre `y + 0.5` satisfies `lo <= y + 0.5 < hi`.
fn rows_between(lo: f64, hi: f64, height: u32) -> (u32, u32) {
    let inside = |y: u32| lo <= f64::from(y) + 0.5 && f64::from(y) + 0.5 < hi;
    let at_or_after_lo = |y: u32| lo <= f64::from(y) + 0.5;
    let before_hi = |y: u32| f64::from(y) + 0.5 < hi;
    let guess = |v: f64| (v - 0.5).ceil().clamp(0.0, f64::from(height)) as u32;
    // The guesses are off by one at most (rounding of `v - 0.5`); the exact tests settle it.
    let mut first = guess(lo);
    while first > 0 && at_or_after_lo(first - 1) {
        first -= 1;
    }
    while first < height && !at_or_after_lo(first) {
        first += 1;
    }
    let mut end = guess(hi).max(first);
    while end > first && !before_hi(end - 1) {
        end -= 1;
    }
    while end < height && before_hi(end) {
        end += 1;
    }
    debug_assert!(first == end || (inside(first) && inside(end - 1)));
    (first, end)
}

/// Fills `edges` with the edges of `polys` that cross a row of a `height`-row mask, sorted
/// by their first row; returns the painting's cost (every vertex, every crossing of an
/// edge and a row: what [`fill_edges`] will do, pixels aside, which the mask's size bounds).
fn polygon_edges(polys: &[Vec<f64>], height: u32, edges: &mut Vec<Edge>) -> u64 {
    edges.clear();
    let mut cost = 0u64;
    for (n, p) in polys.iter().enumerate() {
        let k = p.len() / 2;
        cost += k as u64;
        for i in 0..k {
            let (x0, y0) = (p[2 * i], p[2 * i + 1]);
            let j = (i + 1) % k;
            let (x1, y1) = (p[2 * j], p[2 * j + 1]);
            // Half-open in y: a vertex on the scan line is counted once; a flat edge never.
            let (first, end) = rows_between(y0.min(y1), y0.max(y1), height);
            if first < end {
                cost += u64::from(end - first);
                edges.push(Edge { polygon: n as u32, first, end, x0, y0, x1, y1 });
            }
        }
    }
    edges.sort_by_key(|e| e.first);
    cost
}

/// Sets the pixels whose centres are inside the union of the polygons `edges` came from
/// (even-odd per polygon), by an edge table: each row sees only the edges that cross it.
fn fill_edges(data: &mut [u8], width: u32, edges: &mut [Edge], class: u8) {
    let Some(last) = edges.iter().map(|e| e.end).max() else { return };
    let mut active: Vec<Edge> = Vec::new();
    let mut crossings: Vec<(u32, f64)> = Vec::new();
    let mut next = 0;
    for y in edges[0].first..last {
        while next < edges.len() && edges[next].first == y {
            active.push(edges[next]);
            next += 1;
        }
        active.retain(|e| e.end > y);
        let cy = f64::from(y) + 0.5;
        crossings.clear();
        crossings.extend(active.iter().map(|e| (e.polygon, e.x0 + (cy - e.y0) / (e.y1 - e.y0) * (e.x1 - e.x0))));
        // By polygon, then along the row: each polygon's spans on its own (even-odd).
        crossings.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        let row = &mut data[(y * width) as usize..((y + 1) * width) as usize];
        for polygon in crossings.chunk_by(|a, b| a.0 == b.0) {
            for span in polygon.chunks_exact(2) {
                // Pixels x with span[0] <= x + 0.5 < span[1].
                let from = (span[0].1 - 0.5).ceil().max(0.0);
                let to = (span[1].1 - 0.5).ceil().min(f64::from(width));
                if from < to {
                    row[from as usize..to as usize].fill(class);
                }
            }
        }
    }
}

/// Checks a column-major RLE of a `size = [h, w]` mask against the image's size and its
/// pixel count; returns its cost (its runs and the pixels its ones set).
fn run_cost(counts: &[u32], size: [u32; 2], width: u32, height: u32) -> Result<u64, String> {
    if size != [height, width] {
        return Err(format!("RLE size {size:?} is not the image's [{height}, {width}]"));
    }
    let total = u64::from(width) * u64::from(height);
    let (mut at, mut ones) = (0u64, 0u64);
    for (i, &c) in counts.iter().enumerate() {
        at += u64::from(c);
        if at > total {
            return Err(format!("RLE runs cover more than the {total} pixels of the image"));
        }
        if i % 2 == 1 {
            ones += u64::from(c);
        }
    }
    Ok(counts.len() as u64 + ones)
}

/// Sets the runs of ones of a column-major RLE already checked by [`run_cost`].
fn paint_runs(data: &mut [u8], width: u32, height: u32, counts: &[u32], class: u8) {
    let (mut at, mut ones) = (0u64, false);
    let (w, h) = (u64::from(width), u64::from(height));
    for &c in counts {
        let end = at + u64::from(c);
        if ones {
            for i in at..end {
                // Column-major: index i is (x = i / h, y = i % h).
                let (x, y) = (i / h, i % h);
                data[(y * w + x) as usize] = class;
            }
        }
        at = end;
        ones = !ones;
    }
}

/// pycocotools' `rleFrString`: counts packed 5 bits a character (offset 48), the sign in
/// the last group's 0x10 bit, each count after the second stored as a difference from the
/// count two before it.
fn decode_counts(s: &str) -> Result<Vec<u32>, String> {
    let bytes = s.as_bytes();
    let mut counts: Vec<u32> = Vec::new();
    let mut p = 0;
    while p < bytes.len() {
        let (mut x, mut k, mut more) = (0i64, 0u32, true);
        while more {
            let Some(&b) = bytes.get(p) else { return Err("compressed RLE counts end mid-number".into()) };
            let c = i64::from(b) - 48;
            if !(0..64).contains(&c) || k > 12 {
                return Err(format!("compressed RLE counts have a bad character at {p}"));
            }
            x |= (c & 0x1f) << (5 * k);
            more = c & 0x20 != 0;
            p += 1;
            k += 1;
            if !more && c & 0x10 != 0 {
                x |= -1i64 << (5 * k);
            }
        }
        if counts.len() > 2 {
            x += i64::from(counts[counts.len() - 2]);
        }
        counts.push(u32::try_from(x).map_err(|_| format!("compressed RLE count {x} is negative or too large"))?);
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test fixtures: a failed setup is a failed test

    use super::*;

    #[test]
    fn polygons_set_the_pixels_whose_centres_are_inside_and_later_objects_cover_earlier() {
        let square = Segmentation::Polygons(vec![vec![1.0, 1.0, 4.0, 1.0, 4.0, 3.0, 1.0, 3.0]]);
        let over = Segmentation::Polygons(vec![vec![3.0, 0.0, 5.0, 0.0, 5.0, 2.0, 3.0, 2.0]]);
        let m = paint(5, 4, &[(7, square), (9, over)], 100).unwrap();
        #[rustfmt::skip]
        let want = [
            0, 0, 0, 9, 9,
            0, 7, 7, 9, 9,
            0, 7, 7, 7, 0,
            0, 0, 0, 0, 0,
        ];
        assert_eq!(m.data, want);
    }

    #[test]
    fn rle_runs_are_column_major_in_both_forms() {
        // A 3x2 (w x h) mask with ones at column-major indices 1..4: (0,1), (1,0), (1,1).
        let plain = Segmentation::Rle { counts: vec![1, 3, 2], size: [2, 3] };
        let m = paint(3, 2, &[(5, plain)], 100).unwrap();
        assert_eq!(m.data, [0, 5, 0, 5, 5, 0]);
        // pycocotools.mask.encode of the same mask gives b"13N" ... checked by round trip:
        // '1' = 1, '3' = 3, '2' = 2 (no deltas before the third count).
        let packed = Segmentation::RleString { counts: "132".into(), size: [2, 3] };
        assert_eq!(paint(3, 2, &[(5, packed)], 100).unwrap().data, m.data);
        assert_eq!(decode_counts("0:0").unwrap(), vec![0, 10, 0]);
        assert!(decode_counts("a\u{1}").is_err());
    }

    #[test]
    fn malformed_segmentations_say_what_is_wrong() {
        let short = Segmentation::Polygons(vec![vec![1.0, 2.0, 3.0]]);
        assert!(paint(4, 4, &[(1, short)], 100).unwrap_err().contains("3 numbers"));
        let size = Segmentation::Rle { counts: vec![1], size: [3, 3] };
        assert!(paint(4, 4, &[(1, size)], 100).unwrap_err().contains("not the image's [4, 4]"));
        let long = Segmentation::Rle { counts: vec![10, 10], size: [4, 4] };
        assert!(paint(4, 4, &[(1, long)], 100).unwrap_err().contains("more than the 16 pixels"));
        assert!(paint(40, 40, &[], 100).unwrap_err().contains("max_pixels"));
    }

    /// The painter before the edge table: every row tests every edge of every polygon.
    /// Kept as the reference the edge table must match exactly.
    fn fill_polygons_by_rows(data: &mut [u8], width: u32, height: u32, polys: &[Vec<f64>], class: u8) {
        let mut crossings: Vec<f64> = Vec::new();
        for y in 0..height {
            let cy = f64::from(y) + 0.5;
            for p in polys {
                crossings.clear();
                let k = p.len() / 2;
                for i in 0..k {
                    let (x0, y0) = (p[2 * i], p[2 * i + 1]);
                    let j = (i + 1) % k;
                    let (x1, y1) = (p[2 * j], p[2 * j + 1]);
                    if (y0 <= cy) != (y1 <= cy) {
                        crossings.push(x0 + (cy - y0) / (y1 - y0) * (x1 - x0));
                    }
                }
                crossings.sort_by(f64::total_cmp);
                let row = &mut data[(y * width) as usize..((y + 1) * width) as usize];
                for span in crossings.chunks_exact(2) {
                    let from = (span[0] - 0.5).ceil().max(0.0);
                    let to = (span[1] - 0.5).ceil().min(f64::from(width));
                    if from < to {
                        row[from as usize..to as usize].fill(class);
                    }
                }
            }
        }
    }

    #[test]
    fn the_edge_table_paints_random_polygons_exactly_as_the_row_by_row_painter() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for case in 0..2000 {
            let (w, h) = (1 + (next() % 40) as u32, 1 + (next() % 40) as u32);
            let mut objects = Vec::new();
            for _ in 0..1 + next() % 3 {
                let polys: Vec<Vec<f64>> = (0..1 + next() % 3)
                    .map(|_| {
                        let k = 3 + next() % 12;
                        (0..2 * k)
                            .map(|_| match next() % 4 {
                                // Vertices on pixel centres and edges (the ties), and anywhere,
                                // some outside the canvas.
                                0 => (next() % 50) as f64 - 5.0 + 0.5,
                                1 => (next() % 50) as f64 - 5.0,
                                _ => (next() % 6000) as f64 / 100.0 - 10.0,
                            })
                            .collect()
                    })
                    .collect();
                objects.push((1 + (next() % 200) as u8, Segmentation::Polygons(polys)));
            }
            let mut want = vec![0u8; (w * h) as usize];
            for (class, seg) in &objects {
                let Segmentation::Polygons(polys) = seg else { unreachable!() };
                fill_polygons_by_rows(&mut want, w, h, polys, *class);
            }
            let got = paint(w, h, &objects, 1 << 20).unwrap();
            assert_eq!(got.data, want, "case {case}: {w}x{h} {objects:?}");
        }
    }

    #[test]
    fn painting_past_its_work_bounds_fails_before_it_paints() {
        // One object whose runs set every pixel of a 64x64 mask: 4097 steps, over a
        // 4096-pixel limit for one object.
        let full = Segmentation::Rle { counts: vec![0, 4096], size: [64, 64] };
        let one = paint(64, 64, std::slice::from_ref(&(1, full.clone())), 4096).unwrap_err();
        assert!(one.contains("object 0") && one.contains("limit of 4096 an object"), "{one}");
        // Each of them within an object's limit, but not all of them within a sample's.
        let half = Segmentation::Rle { counts: vec![0, 2048], size: [64, 64] };
        let many: Vec<_> = (0..9).map(|_| (1, half.clone())).collect();
        let sample = paint(64, 64, &many, 4096).unwrap_err();
        assert!(sample.contains("object 7") && sample.contains("a sample (4 x limits.max_pixels)"), "{sample}");
        // A polygon zigzagging across every row, many times: its crossings count, not its area.
        let zigzag: Vec<f64> = (0..1000).flat_map(|i| [f64::from(i) * 0.06, f64::from(i % 2) * 64.0]).collect();
        let zig = Segmentation::Polygons(vec![zigzag]);
        let err = paint(64, 64, &[(1, zig)], 4096).unwrap_err();
        assert!(err.contains("an object"), "{err}");
        assert!(paint(64, 64, &many[..4], 4096).is_ok());
    }
}
