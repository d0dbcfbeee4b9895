//! Untrusted image bytes through the codec: JPEG/PNG header parsing, full and crop-window
//! decodes, restart-marker packing and cutting, and a fused decode+crop plan. Properties:
//! nothing panics or reads out of bounds (AddressSanitizer), memory stays bounded.
//!
//! Input: 8 parameter bytes, then either an image file as it is (mode 0) or the pixels of
//! an image the target encodes and packs with restart markers, followed by
//! (position, value) pairs that corrupt the packed file (mode 1): random bytes rarely
//! make a well-formed seekable JPEG, and this way the cutter sees real ones, damaged.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_codec::{
    add_restart_markers, decode_png, encode_jpeg_with, sniff_format, ImageFormat, JpegDecoder, Plan, Scratch,
    SourcePixels, SubRect, Subsampling,
};
use sluice_core::{Limits, OpSpec, SampleKey, SampleRng, Size};

const MAX_PIXELS: u64 = 1 << 22;

fuzz_target!(|data: &[u8]| {
    let Some((params, rest)) = data.split_first_chunk::<8>() else { return };
    let file = if params[0] % 2 == 0 { rest.to_vec() } else { packed(params, rest) };
    decode(params, &file);
});

/// A JPEG of `params`' size and subsampling with `rest` as pixels, packed with restart
/// markers, then damaged by `rest`'s tail.
fn packed(params: &[u8; 8], rest: &[u8]) -> Vec<u8> {
    let (w, h) = (u32::from(params[1]) + 1, u32::from(params[2]) + 1);
    let subsampling = [
        Subsampling::S444,
        Subsampling::S422,
        Subsampling::S420,
        Subsampling::Gray,
        Subsampling::S440,
        Subsampling::S411,
    ][usize::from(params[3]) % 6];
    let n = (w * h) as usize * 3;
    let (pixels, damage) = rest.split_at(rest.len().min(n));
    let mut rgb: Vec<u8> = pixels.to_vec();
    rgb.resize(n, 0x80);
    let source = if subsampling == Subsampling::Gray { SourcePixels::Gray } else { SourcePixels::Rgb };
    if source == SourcePixels::Gray {
        rgb.truncate((w * h) as usize);
    }
    let Ok(jpeg) = encode_jpeg_with(&rgb, w, h, source, subsampling, 50 + params[4] % 50) else { return Vec::new() };
    let Ok(mut file) = add_restart_markers(&jpeg, 1 + u32::from(params[5] % 4), MAX_PIXELS) else { return jpeg };
    for pair in damage.chunks_exact(3) {
        let pos = usize::from(u16::from_le_bytes([pair[0], pair[1]]));
        if let Some(b) = file.get_mut(pos) {
            *b = pair[2];
        }
    }
    file
}

fn decode(params: &[u8; 8], file: &[u8]) {
    let Ok(format) = sniff_format(file) else { return };
    let mut out = Vec::new();
    // The crop window, in fractions of the image.
    let frac = |b: u8| f64::from(b) / 255.0;
    let window = |w: u32, h: u32| SubRect {
        left: frac(params[4]) * f64::from(w),
        top: frac(params[5]) * f64::from(h),
        width: (frac(params[6]) * f64::from(w)).max(1.0),
        height: (frac(params[7]) * f64::from(h)).max(1.0),
    };
    let target = (u32::from(params[6] % 64) + 1, u32::from(params[7] % 64) + 1);
    match format {
        ImageFormat::Jpeg => {
            let Ok(mut dec) = JpegDecoder::new(MAX_PIXELS) else { return };
            if let Ok(hdr) = dec.header(file) {
                let _ = dec.decode_region(file, window(hdr.width, hdr.height), target, &mut out);
                let _ = dec.decode_full(file, &mut out);
            }
            let _ = add_restart_markers(file, 1 + u32::from(params[3] % 4), MAX_PIXELS);
        }
        ImageFormat::Png => {
            let _ = decode_png(file, MAX_PIXELS, &mut out);
        }
    }

    // The fused plan paths: crop windows on full-resolution coordinates, and a resize.
    let limits = Limits { max_pixels: MAX_PIXELS, ..Limits::default() };
    let side = Size { height: target.1, width: target.0 };
    let plans = [
        vec![OpSpec::Decode, OpSpec::random_resized_crop(side, [0.08, 1.0], [0.75, 4.0 / 3.0])],
        vec![OpSpec::Decode, OpSpec::CenterCrop { size: side }],
        vec![OpSpec::Decode, OpSpec::resize(target.0), OpSpec::CenterCrop { size: side }],
    ];
    let mut scratch = Scratch::new();
    for ops in plans {
        let plan = Plan::compile(&ops, limits);
        let mut slot = vec![0u8; plan.output_bytes()];
        let mut rng = SampleRng::new(u64::from(params[0]), 0, SampleKey(7), 0);
        let _ = plan.run(file, &mut rng, &mut scratch, &mut slot, &mut []);
    }
}
