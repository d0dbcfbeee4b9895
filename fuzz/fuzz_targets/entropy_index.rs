//! Untrusted bytes through the entropy index: the indexer and the window cutter on
//! damaged JPEGs, and the index reader on damaged stored indexes. Properties: nothing
//! panics or reads out of bounds (AddressSanitizer), and a crop cut with an index that the
//! indexer made itself has exactly the pixels of the ordinary decode whenever both decode.
//!
//! Input: 8 parameter bytes, then the pixels of an image the target encodes (baseline, no
//! restart markers), followed by (position, value) pairs that damage either the JPEG
//! (mode 0) or the index stored for it (mode 1), which a second store then reads back.

#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use sluice_codec::{encode_jpeg_with, IndexStore, JpegDecoder, SourcePixels, SubRect, Subsampling};

const MAX_PIXELS: u64 = 1 << 22;

fuzz_target!(|data: &[u8]| {
    let Some((params, rest)) = data.split_first_chunk::<8>() else { return };
    let (w, h) = (u32::from(params[1]) + 1, u32::from(params[2]) + 1);
    let subsampling = [Subsampling::S444, Subsampling::S422, Subsampling::S420, Subsampling::S440, Subsampling::S411]
        [usize::from(params[3]) % 5];
    let n = (w * h) as usize * 3;
    let (pixels, damage) = rest.split_at(rest.len().min(n));
    let mut pixels = pixels.to_vec();
    pixels.resize(n, params[4]);
    let Ok(mut jpeg) = encode_jpeg_with(&pixels, w, h, SourcePixels::Rgb, subsampling, 50 + params[5] % 50) else {
        return;
    };
    let rect = SubRect {
        left: f64::from(u32::from(params[6]) % w),
        top: f64::from(u32::from(params[7]) % h),
        width: f64::from(w / 3 + 1),
        height: f64::from(h / 3 + 1),
    };
    let dir = std::env::temp_dir().join(format!("sluice-fuzz-index-{}", std::process::id()));
    if params[0] % 2 == 0 {
        damage_bytes(&mut jpeg, damage);
        let store = Arc::new(IndexStore::new(1 + u32::from(params[0] >> 4), 1 << 20));
        let (mut plain, mut cut) = (Vec::new(), Vec::new());
        let mut d = JpegDecoder::new(MAX_PIXELS).unwrap();
        let want = d.decode_region(&jpeg, rect, (1, 1), &mut plain);
        d.set_index(Some(&store));
        let got = d.decode_region(&jpeg, rect, (1, 1), &mut cut);
        if let (Ok(a), Ok(b)) = (want, got) {
            let (ax, ay, bx, by) = (a.rect.left as u32, a.rect.top as u32, b.rect.left as u32, b.rect.top as u32);
            for y in 0..a.rect.height as u32 {
                for x in 0..a.rect.width as u32 {
                    let i = (((ay + y) * a.width + ax + x) * 3) as usize;
                    let j = (((by + y) * b.width + bx + x) * 3) as usize;
                    assert_eq!(plain[i..i + 3], cut[j..j + 3], "pixel ({x},{y}) of the crop");
                }
            }
        }
    } else {
        let first = Arc::new(IndexStore::new(2, 1 << 20).with_dir(Some(dir.clone())));
        let mut d = JpegDecoder::new(MAX_PIXELS).unwrap();
        d.set_index(Some(&first));
        let _ = d.decode_region(&jpeg, rect, (1, 1), &mut Vec::new());
        let path = IndexStore::path_in(&dir, IndexStore::fingerprint(&jpeg));
        if let Ok(mut stored) = std::fs::read(&path) {
            damage_bytes(&mut stored, damage);
            let _ = std::fs::write(&path, &stored);
        }
        let second = Arc::new(IndexStore::new(2, 1 << 20).with_dir(Some(dir.clone())));
        d.set_index(Some(&second));
        let _ = d.decode_region(&jpeg, rect, (1, 1), &mut Vec::new());
        let _ = std::fs::remove_file(&path);
    }
});

/// Applies (position, value) pairs from `damage` to `bytes`.
fn damage_bytes(bytes: &mut [u8], damage: &[u8]) {
    for pair in damage.chunks_exact(3) {
        let at = usize::from(u16::from_le_bytes([pair[0], pair[1]])) % bytes.len().max(1);
        if let Some(b) = bytes.get_mut(at) {
            *b = pair[2];
        }
    }
}
