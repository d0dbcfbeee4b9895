//! Times the fused decode + RandomResizedCrop(224) + flip against a plain full-size JPEG
//! decode of the same files (and against the unfused decode-then-crop path).
//!
//! ```text
//! cargo run --release -p sluice-codec --example fused_vs_full [-- IMAGES PASSES WIDTH HEIGHT]
//! PROBE=1 cargo run ...   # also time region decodes of fixed windows
//! ```
//!
//! The images are synthetic but JPEG-realistic: 500x375, 4:2:0, quality 90, smooth
//! gradients + shapes + grain, about 100 KB each (ImageNet's typical size and weight).
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use sluice_codec::{encode_jpeg, JpegDecoder, Plan, Scratch};
use sluice_core::{Limits, OpSpec, PipelineSpec, SampleKey, SampleRng, SourceSpec};

fn synthetic_image(seed: u64, w: u32, h: u32) -> Vec<u8> {
    let mut rng = SampleRng::new(seed, 0, SampleKey(0), 7);
    // Background: two-colour gradient with a slow wave.
    let c0: Vec<f64> = (0..3).map(|_| rng.uniform(20.0, 235.0)).collect();
    let c1: Vec<f64> = (0..3).map(|_| rng.uniform(20.0, 235.0)).collect();
    let angle = rng.uniform(0.0, std::f64::consts::TAU);
    let freq = rng.uniform(0.01, 0.05);
    let mut img = vec![0f64; (w * h * 3) as usize];
    for y in 0..h {
        for x in 0..w {
            let t = ((f64::from(x) * angle.cos() + f64::from(y) * angle.sin()) / f64::from(w + h) + 0.5)
                .clamp(0.0, 1.0);
            let wave = 20.0 * (f64::from(x) * freq).sin() * (f64::from(y) * freq * 1.3).cos();
            for c in 0..3 {
                img[((y * w + x) * 3 + c) as usize] = c0[c as usize] * (1.0 - t) + c1[c as usize] * t + wave;
            }
        }
    }
    // Shapes: discs and rectangles with their own textures.
    for _ in 0..40 {
        let (cx, cy) = (rng.uniform(0.0, f64::from(w)), rng.uniform(0.0, f64::from(h)));
        let r = rng.uniform(10.0, 90.0);
        let col: Vec<f64> = (0..3).map(|_| rng.uniform(0.0, 255.0)).collect();
        let disc = rng.next_f64() < 0.5;
        let stripes = rng.uniform(0.05, 0.4);
        for y in (cy - r).max(0.0) as u32..((cy + r) as u32).min(h) {
            for x in (cx - r).max(0.0) as u32..((cx + r) as u32).min(w) {
                let (dx, dy) = (f64::from(x) - cx, f64::from(y) - cy);
                if disc && dx * dx + dy * dy > r * r {
                    continue;
                }
                let tex = 25.0 * ((dx + dy) * stripes).sin();
                for c in 0..3 {
                    img[((y * w + x) * 3 + c) as usize] = col[c as usize] + tex;
                }
            }
        }
    }
    // Texture with a natural-image (1/f) spectrum: value noise summed over octaves, the
    // amplitude falling with the scale, plus a little sensor grain.
    let mut lum = vec![0f64; (w * h) as usize];
    let mut cell = 128u32;
    let mut amp = 28.0;
    while cell >= 1 {
        let (gw, gh) = (w / cell + 2, h / cell + 2);
        let grid: Vec<f64> = (0..gw * gh).map(|_| rng.uniform(-1.0, 1.0)).collect();
        for y in 0..h {
            let (gy, fy) = ((y / cell) as usize, f64::from(y % cell) / f64::from(cell));
            for x in 0..w {
                let (gx, fx) = ((x / cell) as usize, f64::from(x % cell) / f64::from(cell));
                let at = |xx: usize, yy: usize| grid[yy * gw as usize + xx];
                let top = at(gx, gy) * (1.0 - fx) + at(gx + 1, gy) * fx;
                let bottom = at(gx, gy + 1) * (1.0 - fx) + at(gx + 1, gy + 1) * fx;
                lum[(y * w + x) as usize] += amp * (top * (1.0 - fy) + bottom * fy);
            }
        }
        cell /= 2;
        amp *= TEXTURE_FALLOFF;
    }
    img.iter()
        .enumerate()
        .map(|(i, &v)| {
            let grain = (rng.next_f64() + rng.next_f64() - 1.0) * GRAIN;
            (v + lum[i / 3] + grain).clamp(0.0, 255.0) as u8
        })
        .collect()
}

/// Amplitude ratio between successive octaves, and grain amplitude: tuned so the files
/// average about 100 KB at quality 90, like ImageNet's 500x375 photos.
const TEXTURE_FALLOFF: f64 = 0.95;
const GRAIN: f64 = 10.0;

fn per_image(d: Duration, n: usize) -> f64 {
    d.as_secs_f64() * 1e6 / n as f64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(200);
    let passes: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(5);
    let w: u32 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(500);
    let h: u32 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(375);

    let files: Vec<Vec<u8>> =
        (0..n as u64).map(|i| encode_jpeg(&synthetic_image(i, w, h), w, h, 90)).collect::<Result<_, _>>()?;
    let mean_kb = files.iter().map(Vec::len).sum::<usize>() as f64 / n as f64 / 1000.0;
    println!("{n} synthetic {w}x{h} 4:2:0 q90 JPEGs, mean {mean_kb:.1} KB, {passes} passes each");

    let spec = PipelineSpec::train_default(SourceSpec::ImageFolder { root: ".".into() }, 224, 1);
    let fused = Plan::compile(&spec.ops, spec.limits);
    // A flip with p = 0 between decode and crop blocks fusion: decode whole, then crop.
    let mut unfused_ops = spec.ops.clone();
    unfused_ops.insert(1, OpSpec::RandomHorizontalFlip { p: 0.0 });
    let unfused = Plan::compile(&unfused_ops, Limits::default());

    let mut dec = JpegDecoder::new(Limits::default().max_pixels)?;
    let mut full = Vec::new();
    let mut scratch = Scratch::new();
    println!("resizer SIMD: {:?}", scratch.resizer().cpu_extensions());
    let mut out = vec![0u8; fused.output_bytes()];
    let mut times = vec![Duration::ZERO; fused.step_names().len()];
    let mut times_unfused = vec![Duration::ZERO; unfused.step_names().len()];

    // Warm up caches and buffers.
    for (i, f) in files.iter().enumerate().take(20) {
        dec.decode_full(f, &mut full)?;
        fused.run(f, &mut SampleRng::new(0, 0, SampleKey(i as u64), 0), &mut scratch, &mut out, &mut [])?;
    }

    let (mut t_full, mut t_fused, mut t_unfused) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for pass in 0..passes as u64 {
        // Interleave the three so machine noise hits them alike.
        let t = Instant::now();
        for f in &files {
            dec.decode_full(f, &mut full)?;
        }
        t_full += t.elapsed();
        let t = Instant::now();
        for (i, f) in files.iter().enumerate() {
            let mut rng = SampleRng::new(0, pass, SampleKey(i as u64), 0);
            fused.run(f, &mut rng, &mut scratch, &mut out, &mut times)?;
        }
        t_fused += t.elapsed();
        let t = Instant::now();
        for (i, f) in files.iter().enumerate() {
            let mut rng = SampleRng::new(0, pass, SampleKey(i as u64), 0);
            unfused.run(f, &mut rng, &mut scratch, &mut out, &mut times_unfused)?;
        }
        t_unfused += t.elapsed();
    }
    let total = n * passes;
    let (full_us, fused_us, unfused_us) =
        (per_image(t_full, total), per_image(t_fused, total), per_image(t_unfused, total));
    println!("plain full decode (decode_full)           {full_us:8.1} us/image");
    println!(
        "fused decode+RRC(224)+flip -> u8 HWC      {fused_us:8.1} us/image   ratio to full decode {:.2}",
        fused_us / full_us
    );
    println!(
        "unfused full decode, then RRC+flip        {unfused_us:8.1} us/image   ratio to full decode {:.2}",
        unfused_us / full_us
    );
    for (name, t) in fused.step_names().iter().zip(&times) {
        println!("  fused step {name:<28} {:8.1} us/image", per_image(*t, total));
    }
    for (name, t) in unfused.step_names().iter().zip(&times_unfused) {
        println!("  unfused step {name:<26} {:8.1} us/image", per_image(*t, total));
    }
    if std::env::var_os("PROBE").is_some() {
        use sluice_codec::SubRect;
        let mut buf = Vec::new();
        let (fw, fh) = (f64::from(w), f64::from(h));
        // Unscaled windows: what entropy decoding (never skippable above the window) costs
        // against IDCT and colour conversion (only inside it).
        for (label, rect) in [
            ("32x32 top-left", SubRect { left: 0.0, top: 0.0, width: 32.0, height: 32.0 }),
            ("32x32 bottom-right", SubRect { left: fw - 40.0, top: fh - 35.0, width: 32.0, height: 32.0 }),
            ("full width, top 32 rows", SubRect { left: 0.0, top: 0.0, width: fw, height: 32.0 }),
            (
                "half-size centre",
                SubRect { left: fw / 4.0, top: fh / 4.0, width: fw / 2.0, height: fh / 2.0 },
            ),
            ("full", SubRect { left: 0.0, top: 0.0, width: fw, height: fh }),
        ] {
            let t = Instant::now();
            for _ in 0..passes {
                for f in &files {
                    dec.decode_region(f, rect, (rect.width as u32, rect.height as u32), &mut buf)?;
                }
            }
            println!("probe region {label:<26} {:8.1} us/image", per_image(t.elapsed(), total));
        }
    }
    Ok(())
}
