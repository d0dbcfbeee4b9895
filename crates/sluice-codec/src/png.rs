//! PNG to RGB8 with the `png` crate: palettes expanded, 16-bit reduced to 8, grey made RGB,
//! alpha dropped (as PIL's `convert("RGB")`, which torchvision's loaders use).

use png::{BitDepth, ColorType, Transformations};

use crate::error::CodecError;

fn corrupt(e: png::DecodingError) -> CodecError {
    CodecError::Corrupt(e.to_string())
}

/// Decodes a PNG into `out` as interleaved RGB8 and returns (width, height). An image whose
/// header declares more than `max_pixels` pixels is refused before any pixel buffer grows.
pub fn decode_png(bytes: &[u8], max_pixels: u64, out: &mut Vec<u8>) -> Result<(u32, u32), CodecError> {
    if bytes.is_empty() {
        return Err(CodecError::Empty);
    }
    let mut decoder = png::Decoder::new(bytes);
    decoder.set_transformations(Transformations::EXPAND | Transformations::STRIP_16);
    let info = decoder.read_header_info().map_err(corrupt)?;
    let (width, height) = (info.width, info.height);
    if u64::from(width) * u64::from(height) > max_pixels {
        return Err(CodecError::TooLarge { width: width.into(), height: height.into(), limit: max_pixels });
    }
    let mut reader = decoder.read_info().map_err(corrupt)?;
    let px = width as usize * height as usize;
    let raw_len = reader.output_buffer_size();
    out.resize(raw_len.max(px * 3), 0);
    let frame = reader.next_frame(&mut out[..raw_len]).map_err(corrupt)?;
    if (frame.width, frame.height) != (width, height) {
        return Err(CodecError::Corrupt(format!(
            "first frame is {}x{}, the header says {width}x{height}",
            frame.width, frame.height
        )));
    }
    if frame.bit_depth != BitDepth::Eight {
        return Err(CodecError::Unsupported(format!("PNG bit depth {:?} after expansion", frame.bit_depth)));
    }
    // Convert in place. Growing layouts (grey) go back to front, shrinking ones (alpha)
    // front to back, so no pixel is overwritten before it is read.
    match frame.color_type {
        ColorType::Rgb => {}
        ColorType::Rgba => {
            for i in 0..px {
                out.copy_within(4 * i..4 * i + 3, 3 * i);
            }
        }
        ColorType::Grayscale => {
            for i in (0..px).rev() {
                let v = out[i];
                out[3 * i..3 * i + 3].fill(v);
            }
        }
        ColorType::GrayscaleAlpha => {
            for i in (0..px).rev() {
                let v = out[2 * i];
                out[3 * i..3 * i + 3].fill(v);
            }
        }
        ColorType::Indexed => {
            return Err(CodecError::Unsupported("palette PNG was not expanded".into()));
        }
    }
    out.truncate(px * 3);
    Ok((width, height))
}

/// A PNG's `(width, height)`, from its header.
pub fn png_size(bytes: &[u8]) -> Result<(u32, u32), CodecError> {
    let mut decoder = png::Decoder::new(bytes);
    decoder.set_transformations(Transformations::IDENTITY);
    let info = decoder.read_header_info().map_err(corrupt)?;
    Ok((info.width, info.height))
}

/// Decodes a segmentation mask PNG: 8-bit greyscale, or palette indices taken as they are
/// (as PIL's mode `"P"` reads them, the VOC convention), one u8 class id per pixel. Other
/// colour types are refused: a mask is one channel.
pub fn decode_png_mask(bytes: &[u8], max_pixels: u64) -> Result<sluice_core::Mask, CodecError> {
    if bytes.is_empty() {
        return Err(CodecError::Empty);
    }
    let mut decoder = png::Decoder::new(bytes);
    decoder.set_transformations(Transformations::IDENTITY);
    let info = decoder.read_header_info().map_err(corrupt)?;
    let (width, height) = (info.width, info.height);
    if u64::from(width) * u64::from(height) > max_pixels {
        return Err(CodecError::TooLarge { width: width.into(), height: height.into(), limit: max_pixels });
    }
    let (color, depth) = (info.color_type, info.bit_depth);
    if !matches!(color, ColorType::Grayscale | ColorType::Indexed) || depth != BitDepth::Eight {
        return Err(CodecError::Unsupported(format!(
            "a mask PNG must be 8-bit greyscale or palette indices; this one is {color:?} {depth:?}"
        )));
    }
    let mut reader = decoder.read_info().map_err(corrupt)?;
    let mut data = vec![0u8; reader.output_buffer_size()];
    let frame = reader.next_frame(&mut data).map_err(corrupt)?;
    data.truncate(frame.buffer_size());
    if (frame.width, frame.height) != (width, height) || data.len() != width as usize * height as usize {
        return Err(CodecError::Corrupt(format!("a {width}x{height} mask decoded to {} bytes", data.len())));
    }
    Ok(sluice_core::Mask { width, height, data })
}

/// Encodes a `w x h` mask (one u8 a pixel) as an 8-bit greyscale PNG.
pub fn encode_png_mask(data: &[u8], w: u32, h: u32) -> Result<Vec<u8>, CodecError> {
    let mut buf = Vec::new();
    let mut enc = png::Encoder::new(&mut buf, w, h);
    enc.set_color(ColorType::Grayscale);
    enc.set_depth(BitDepth::Eight);
    let fail = |e: png::EncodingError| CodecError::Shape(format!("cannot encode a {w}x{h} mask: {e}"));
    let mut writer = enc.write_header().map_err(fail)?;
    writer.write_image_data(data).map_err(fail)?;
    writer.finish().map_err(fail)?;
    Ok(buf)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Encodes a PNG with the `png` crate.
    pub(crate) fn encode_png(
        data: &[u8],
        w: u32,
        h: u32,
        color: ColorType,
        depth: BitDepth,
        palette: Option<&[u8]>,
    ) -> Vec<u8> {
        let mut buf = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut buf, w, h);
            enc.set_color(color);
            enc.set_depth(depth);
            if let Some(p) = palette {
                enc.set_palette(p.to_vec());
            }
            let mut writer = enc.write_header().unwrap();
            writer.write_image_data(data).unwrap();
        }
        buf
    }

    #[test]
    fn masks_round_trip_and_colour_masks_are_refused() {
        let data: Vec<u8> = (0..12).collect();
        let png = encode_png_mask(&data, 4, 3).unwrap();
        assert_eq!(decode_png_mask(&png, 100).unwrap(), sluice_core::Mask { width: 4, height: 3, data: data.clone() });
        let palette: Vec<u8> = (0..12 * 3).map(|i| i as u8).collect();
        let indexed = encode_png(&data, 4, 3, ColorType::Indexed, BitDepth::Eight, Some(&palette));
        assert_eq!(decode_png_mask(&indexed, 100).unwrap().data, data, "palette indices are the class ids");
        let rgb = encode_png(&[0; 36], 4, 3, ColorType::Rgb, BitDepth::Eight, None);
        let err = decode_png_mask(&rgb, 100).unwrap_err().to_string();
        assert!(err.contains("greyscale or palette"), "{err}");
        assert!(matches!(decode_png_mask(&png, 5), Err(CodecError::TooLarge { .. })));
    }

    #[test]
    fn every_color_type_decodes_to_rgb8() {
        let (w, h) = (5u32, 3u32);
        let n = (w * h) as usize;
        let mut out = Vec::new();

        let rgb: Vec<u8> = (0..n * 3).map(|i| (i * 7) as u8).collect();
        let png = encode_png(&rgb, w, h, ColorType::Rgb, BitDepth::Eight, None);
        assert_eq!(decode_png(&png, 1000, &mut out).unwrap(), (w, h));
        assert_eq!(out, rgb);

        // RGBA: alpha dropped, colours kept even where alpha is 0.
        let rgba: Vec<u8> = rgb.chunks(3).flat_map(|p| [p[0], p[1], p[2], 0]).collect();
        let png = encode_png(&rgba, w, h, ColorType::Rgba, BitDepth::Eight, None);
        decode_png(&png, 1000, &mut out).unwrap();
        assert_eq!(out, rgb);

        // 16-bit RGB: high bytes kept.
        let rgb16: Vec<u8> = rgb.iter().flat_map(|&v| [v, 0x99]).collect();
        let png = encode_png(&rgb16, w, h, ColorType::Rgb, BitDepth::Sixteen, None);
        decode_png(&png, 1000, &mut out).unwrap();
        assert_eq!(out, rgb);

        // Grey and grey+alpha.
        let grey: Vec<u8> = (0..n).map(|i| (i * 13) as u8).collect();
        let grey_rgb: Vec<u8> = grey.iter().flat_map(|&v| [v, v, v]).collect();
        let png = encode_png(&grey, w, h, ColorType::Grayscale, BitDepth::Eight, None);
        decode_png(&png, 1000, &mut out).unwrap();
        assert_eq!(out, grey_rgb);
        let grey_a: Vec<u8> = grey.iter().flat_map(|&v| [v, 255 - v]).collect();
        let png = encode_png(&grey_a, w, h, ColorType::GrayscaleAlpha, BitDepth::Eight, None);
        decode_png(&png, 1000, &mut out).unwrap();
        assert_eq!(out, grey_rgb);

        // 16-bit grey + alpha.
        let grey_a16: Vec<u8> = grey.iter().flat_map(|&v| [v, 1, 255, 255]).collect();
        let png = encode_png(&grey_a16, w, h, ColorType::GrayscaleAlpha, BitDepth::Sixteen, None);
        decode_png(&png, 1000, &mut out).unwrap();
        assert_eq!(out, grey_rgb);

        // Palette.
        let palette = [255u8, 0, 0, 0, 255, 0, 0, 0, 255];
        let idx: Vec<u8> = (0..n).map(|i| (i % 3) as u8).collect();
        let png = encode_png(&idx, w, h, ColorType::Indexed, BitDepth::Eight, Some(&palette));
        decode_png(&png, 1000, &mut out).unwrap();
        let want: Vec<u8> = idx.iter().flat_map(|&i| palette[i as usize * 3..i as usize * 3 + 3].to_vec()).collect();
        assert_eq!(out, want);

        // 1-bit grey: expanded to 0/255.
        let bits = vec![0b1010_0000u8; h as usize]; // one byte per row: pixels 1,0,1,0,0
        let png = encode_png(&bits, w, h, ColorType::Grayscale, BitDepth::One, None);
        decode_png(&png, 1000, &mut out).unwrap();
        assert_eq!(&out[..15], &[255, 255, 255, 0, 0, 0, 255, 255, 255, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn corrupt_truncated_and_huge_pngs_are_errors() {
        let (w, h) = (64u32, 64u32);
        let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i * 31 % 251) as u8).collect();
        let png = encode_png(&rgb, w, h, ColorType::Rgb, BitDepth::Eight, None);
        let mut out = Vec::new();

        assert_eq!(decode_png(&[], 1000, &mut out), Err(CodecError::Empty));
        assert!(matches!(decode_png(&png[..png.len() / 2], 1 << 20, &mut out), Err(CodecError::Corrupt(_))));
        assert!(matches!(decode_png(&png[..20], 1 << 20, &mut out), Err(CodecError::Corrupt(_))));
        let mut bad = png.clone();
        let n = bad.len();
        bad[n / 2] ^= 0x55; // breaks the IDAT CRC
        assert!(matches!(decode_png(&bad, 1 << 20, &mut out), Err(CodecError::Corrupt(_))));
        assert!(matches!(decode_png(b"\x89PNG\r\n\x1a\nnonsense", 1 << 20, &mut out), Err(CodecError::Corrupt(_))));

        // Header declaring 100000 x 100000: patch IHDR width/height (bytes 16..24) and its CRC.
        let mut huge = png.clone();
        huge[16..20].copy_from_slice(&100_000u32.to_be_bytes());
        huge[20..24].copy_from_slice(&100_000u32.to_be_bytes());
        let crc = crc32(&huge[12..29]);
        huge[29..33].copy_from_slice(&crc.to_be_bytes());
        let mut fresh = Vec::new();
        assert_eq!(
            decode_png(&huge, 1 << 26, &mut fresh),
            Err(CodecError::TooLarge { width: 100_000, height: 100_000, limit: 1 << 26 })
        );
        assert_eq!(fresh.capacity(), 0, "nothing allocated");

        // Still decodes the good one.
        assert_eq!(decode_png(&png, 1 << 20, &mut out).unwrap(), (w, h));
        assert_eq!(out, rgb);
    }

    fn crc32(data: &[u8]) -> u32 {
        let mut crc = 0xFFFF_FFFFu32;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
            }
        }
        !crc
    }
}
