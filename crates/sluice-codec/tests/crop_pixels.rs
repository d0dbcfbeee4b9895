//! A crop decodes to exactly the pixels of the whole image decoded and then cropped, in
//! every path: the ordinary region decode, a file with restart markers (`sluice pack`), and
//! an ordinary file cut with its entropy index. Over sizes whose crop edges fall inside
//! chroma blocks, every subsampling, optimised tables, EXIF and ICC segments, grayscale and
//! CMYK.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use sluice_codec::{
    add_restart_markers, encode_jpeg_optimized, encode_jpeg_with, IndexStore, JpegDecoder, SourcePixels, SubRect,
    Subsampling,
};

const LIMIT: u64 = 1 << 26;

/// A textured image: no flat areas, so any difference in upsampling shows.
fn texture(w: u32, h: u32, channels: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity((w * h * channels) as usize);
    for y in 0..h {
        for x in 0..w {
            let (fx, fy) = (f64::from(x), f64::from(y));
            for c in 0..channels {
                let f = f64::from(c + 2);
                v.push((128.0 + 110.0 * (fx / (3.0 * f)).sin() * (fy / (2.0 * f + 1.0)).cos()) as u8);
            }
        }
    }
    v
}

/// Inserts EXIF (APP1) and ICC (APP2) segments after SOI, as cameras write them.
fn with_app_segments(jpeg: &[u8]) -> Vec<u8> {
    let mut out = jpeg[..2].to_vec();
    for (marker, payload) in [(0xE1u8, &b"Exif\0\0MM\0*\0\0\0\x08\0\0"[..]), (0xE2, &[b'I'; 300][..])] {
        out.extend_from_slice(&[0xFF, marker]);
        out.extend_from_slice(&((payload.len() + 2) as u16).to_be_bytes());
        out.extend_from_slice(payload);
    }
    out.extend_from_slice(&jpeg[2..]);
    out
}

struct Case {
    name: String,
    file: Vec<u8>,
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let sizes = [(621, 415), (203, 157), (4000, 3), (33, 17), (17, 301)];
    let subsamplings = [Subsampling::S420, Subsampling::S422, Subsampling::S444, Subsampling::S440, Subsampling::S411];
    for (w, h) in sizes {
        for s in subsamplings {
            let rgb = texture(w, h, 3);
            out.push(Case {
                name: format!("{w}x{h} {s:?}"),
                file: encode_jpeg_with(&rgb, w, h, SourcePixels::Rgb, s, 90).unwrap(),
            });
        }
        let rgb = texture(w, h, 3);
        out.push(Case {
            name: format!("{w}x{h} 4:2:0 optimised, EXIF, ICC"),
            file: with_app_segments(
                &encode_jpeg_optimized(&rgb, w, h, SourcePixels::Rgb, Subsampling::S420, 85).unwrap(),
            ),
        });
        out.push(Case {
            name: format!("{w}x{h} gray"),
            file: encode_jpeg_with(&texture(w, h, 1), w, h, SourcePixels::Gray, Subsampling::Gray, 90).unwrap(),
        });
        out.push(Case {
            name: format!("{w}x{h} CMYK"),
            file: encode_jpeg_with(&texture(w, h, 4), w, h, SourcePixels::Cmyk, Subsampling::S420, 90).unwrap(),
        });
    }
    out
}

/// Deterministic integer crop windows, small and large, at every offset phase.
fn windows(w: u32, h: u32, n: usize) -> Vec<(u32, u32, u32, u32)> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(w * 7919 + h);
    let mut next = |m: u32| {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((state >> 33) % u64::from(m.max(1))) as u32
    };
    let mut out = vec![(w / 2, h / 2, 1, 1), (0, 0, w, h), (w - 1, h - 1, 1, 1)];
    while out.len() < n {
        let cw = 1 + next(w);
        let ch = 1 + next(h);
        out.push((next(w - cw + 1), next(h - ch + 1), cw, ch));
    }
    out
}

fn crop(src: &[u8], w: u32, (x, y, cw, ch): (u32, u32, u32, u32)) -> Vec<u8> {
    let mut out = Vec::new();
    for row in y..y + ch {
        let s = ((row * w + x) * 3) as usize;
        out.extend_from_slice(&src[s..s + (cw * 3) as usize]);
    }
    out
}

/// Decodes `win` of `file` (full scale) and returns its pixels.
fn region(d: &mut JpegDecoder, file: &[u8], win: (u32, u32, u32, u32)) -> Vec<u8> {
    let (x, y, cw, ch) = win;
    let rect = SubRect { left: f64::from(x), top: f64::from(y), width: f64::from(cw), height: f64::from(ch) };
    let mut buf = Vec::new();
    let got = d.decode_region(file, rect, (cw, ch), &mut buf).unwrap();
    assert_eq!(got.scale_denom, 1);
    assert_eq!(got.rect.left.fract(), 0.0);
    crop(&buf, got.width, (got.rect.left as u32, got.rect.top as u32, cw, ch))
}

#[test]
fn every_crop_path_gives_the_pixels_of_the_whole_image_cropped() {
    let store = Arc::new(IndexStore::new(2, 64 << 20));
    let mut plain = JpegDecoder::new(LIMIT).unwrap();
    let mut indexed = JpegDecoder::new(LIMIT).unwrap();
    indexed.set_index(Some(&store));
    let mut failures = Vec::new();
    for case in cases() {
        let mut whole = Vec::new();
        let (w, h) = plain.decode_full(&case.file, &mut whole).unwrap();
        let packed = add_restart_markers(&case.file, 2, LIMIT).unwrap();
        for win in windows(w, h, 40) {
            let want = crop(&whole, w, win);
            for (path, got) in [
                ("ordinary", region(&mut plain, &case.file, win)),
                ("packed", region(&mut plain, &packed, win)),
                ("indexed", region(&mut indexed, &case.file, win)),
            ] {
                let worst = got.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).max().unwrap_or(0);
                if worst > 0 && failures.len() < 20 {
                    failures.push(format!("{} {path} {win:?}: up to {worst} levels off", case.name));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} crops differ from the whole image:\n{}", failures.len(), failures.join("\n"));
    let stats = store.stats();
    // Every case but CMYK's (indexable too: four components) is baseline with no restart
    // markers: all are indexed, and most crops were cut.
    assert_eq!(stats.unservable, 0, "{stats:?}");
    assert_eq!(stats.indexed, cases().len() as u64, "{stats:?}");
    assert!(stats.cut > 300, "{stats:?}");
}
