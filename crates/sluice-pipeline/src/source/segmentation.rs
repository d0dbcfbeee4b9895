//! COCO segmentations painted into a semantic mask, when a sample is loaded.
//!
//! The stated rule: a `width x height` canvas of zeros; each object, in annotation order,
//! sets its pixels to its class id (a later object covers an earlier one). An RLE sets
//! exactly its runs (as pycocotools decodes them: column-major, starting with zeros). A
//! polygon sets the pixels whose centre `(x + 0.5, y + 0.5)` lies inside it (even-odd
//! rule; an object's polygons are unioned). pycocotools rasterises polygons differently at
//! their edges (it walks the outline on a 5x finer grid), so a polygon's edge pixels may
//! differ from its masks by one pixel; interiors are the same.

use sluice_core::{Mask, Segmentation};

/// Paints `objects` onto a `width x height` mask; says what is wrong with a malformed one.
pub fn paint(width: u32, height: u32, objects: &[(u8, Segmentation)], max_pixels: u64) -> Result<Mask, String> {
    let n = u64::from(width) * u64::from(height);
    if n > max_pixels {
        return Err(format!("a {width}x{height} mask is over the limit of {max_pixels} pixels (limits.max_pixels)"));
    }
    let mut data = vec![0u8; n as usize];
    for (i, (class, seg)) in objects.iter().enumerate() {
        let fail = |why: String| format!("segmentation of object {i}: {why}");
        match seg {
            Segmentation::Polygons(polys) => {
                for p in polys {
                    if p.len() < 6 || p.len() % 2 != 0 || !p.iter().all(|v| v.is_finite()) {
                        return Err(fail(format!("a polygon of {} numbers (needs x, y pairs, 3 or more)", p.len())));
                    }
                }
                fill_polygons(&mut data, width, height, polys, *class);
            }
            Segmentation::Rle { counts, size } => {
                paint_runs(&mut data, width, height, counts, *size, *class).map_err(fail)?
            }
            Segmentation::RleString { counts, size } => {
                let counts = decode_counts(counts).map_err(fail)?;
                paint_runs(&mut data, width, height, &counts, *size, *class).map_err(fail)?;
            }
        }
    }
    Ok(Mask { width, height, data })
}

/// Sets the pixels whose centres are inside the union of `polys` (even-odd per polygon).
fn fill_polygons(data: &mut [u8], width: u32, height: u32, polys: &[Vec<f64>], class: u8) {
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
                // Half-open in y: a vertex on the scan line is counted once.
                if (y0 <= cy) != (y1 <= cy) {
                    crossings.push(x0 + (cy - y0) / (y1 - y0) * (x1 - x0));
                }
            }
            crossings.sort_by(f64::total_cmp);
            let row = &mut data[(y * width) as usize..((y + 1) * width) as usize];
            for span in crossings.chunks_exact(2) {
                // Pixels x with span[0] <= x + 0.5 < span[1].
                let from = (span[0] - 0.5).ceil().max(0.0);
                let to = (span[1] - 0.5).ceil().min(f64::from(width));
                if from < to {
                    row[from as usize..to as usize].fill(class);
                }
            }
        }
    }
}

/// Sets the runs of ones of a column-major RLE of a `size = [h, w]` mask.
fn paint_runs(
    data: &mut [u8],
    width: u32,
    height: u32,
    counts: &[u32],
    size: [u32; 2],
    class: u8,
) -> Result<(), String> {
    if size != [height, width] {
        return Err(format!("RLE size {size:?} is not the image's [{height}, {width}]"));
    }
    let total = u64::from(width) * u64::from(height);
    let (mut at, mut ones) = (0u64, false);
    for &c in counts {
        let end = at + u64::from(c);
        if end > total {
            return Err(format!("RLE runs cover more than the {total} pixels of the image"));
        }
        if ones {
            for i in at..end {
                // Column-major: index i is (x = i / h, y = i % h).
                let (x, y) = (i / u64::from(height), i % u64::from(height));
                data[(y * u64::from(width) + x) as usize] = class;
            }
        }
        at = end;
        ones = !ones;
    }
    Ok(())
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
}
