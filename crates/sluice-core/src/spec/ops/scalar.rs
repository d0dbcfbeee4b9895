//! The short forms torchvision's transforms accept for a parameter that sluice keeps as a
//! fixed-length array: `degrees = 30` for `[-30, 30]`, `padding = 4` for four sides of 4,
//! `fill = 128` for every channel. Each is read here (`deserialize_with`) into the array the
//! op holds, which is also how it is written back.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

/// The most values any of these parameters takes (shear's four).
const MOST: usize = 4;

/// A number, or a list of up to [`MOST`] numbers, as given.
#[derive(Debug, Clone, PartialEq)]
enum Given {
    One(f64),
    List(Vec<f64>),
}

impl<'de> Deserialize<'de> for Given {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Given;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number or a list of numbers")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Given, E> {
                Ok(Given::One(v as f64))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Given, E> {
                Ok(Given::One(v as f64))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Given, E> {
                Ok(Given::One(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Given, A::Error> {
                let mut values = Vec::new();
                while let Some(v) = seq.next_element::<f64>()? {
                    if values.len() == MOST {
                        return Err(de::Error::custom(format!("at most {MOST} values")));
                    }
                    values.push(v);
                }
                Ok(Given::List(values))
            }
        }
        d.deserialize_any(V)
    }
}

/// `degrees` (rotation, affine): `d >= 0` means `[-d, d]`, as torchvision's
/// `_setup_angle`.
pub(super) fn degrees<'de, D: Deserializer<'de>>(d: D) -> Result<[f64; 2], D::Error> {
    match Given::deserialize(d)? {
        Given::One(v) => symmetric(v, "degrees").map_err(de::Error::custom),
        Given::List(l) => match l[..] {
            [lo, hi] => Ok([lo, hi]),
            _ => Err(de::Error::custom(format!(
                "degrees: a number d (for [-d, d]) or [min, max]; got {} values",
                l.len()
            ))),
        },
    }
}

/// `shear` (affine): `s >= 0` means x in `[-s, s]`, `[min, max]` x in that range, four
/// values the x then the y range, as torchvision's RandomAffine; y is 0 unless given.
pub(super) fn shear<'de, D: Deserializer<'de>>(d: D) -> Result<Option<[f64; 4]>, D::Error> {
    let Some(given) = Option::<Given>::deserialize(d)? else { return Ok(None) };
    let x = match given {
        Given::One(v) => symmetric(v, "shear").map_err(de::Error::custom)?,
        Given::List(l) => match l[..] {
            [lo, hi] => [lo, hi],
            [x0, x1, y0, y1] => return Ok(Some([x0, x1, y0, y1])),
            _ => {
                return Err(de::Error::custom(format!(
                    "shear: a number s (for x in [-s, s]), [min, max] (x) or [x min, x max, y min, y max]; \
                     got {} values",
                    l.len()
                )))
            }
        },
    };
    Ok(Some([x[0], x[1], 0.0, 0.0]))
}

/// `padding` (pad): one value for every side, `[left/right, top/bottom]` or `[left, top,
/// right, bottom]`, as torchvision's Pad.
pub(super) fn padding<'de, D: Deserializer<'de>>(d: D) -> Result<[u32; 4], D::Error> {
    sides(Given::deserialize(d)?).map_err(de::Error::custom)
}

/// `padding` of `random_crop`: as [`padding`], or left out.
pub(super) fn padding_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<[u32; 4]>, D::Error> {
    Option::<Given>::deserialize(d)?.map(sides).transpose().map_err(de::Error::custom)
}

/// `fill`: one value for every channel or `[r, g, b]`, each in 0..=255, as torchvision's
/// `fill` for a u8 image.
pub(super) fn fill<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 3], D::Error> {
    rgb(Given::deserialize(d)?).map_err(de::Error::custom)
}

/// `fill` of a policy: as [`fill`], or left out (torchvision's `fill=None`).
pub(super) fn fill_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<[u8; 3]>, D::Error> {
    Option::<Given>::deserialize(d)?.map(rgb).transpose().map_err(de::Error::custom)
}

fn symmetric(v: f64, name: &str) -> Result<[f64; 2], String> {
    if v >= 0.0 {
        Ok([-v, v])
    } else {
        Err(format!("{name}: a single number must be at least 0 (it means [-{name}, {name}]); got {v}"))
    }
}

fn sides(given: Given) -> Result<[u32; 4], String> {
    let side = |v: f64| whole(v, u32::MAX.into(), "padding").map(|v| v as u32);
    match given {
        Given::One(v) => Ok([side(v)?; 4]),
        Given::List(l) => match l[..] {
            [v] => Ok([side(v)?; 4]),
            [x, y] => Ok([side(x)?, side(y)?, side(x)?, side(y)?]),
            [l, t, r, b] => Ok([side(l)?, side(t)?, side(r)?, side(b)?]),
            _ => Err(format!(
                "padding: one value, [left/right, top/bottom] or [left, top, right, bottom]; got {} values",
                l.len()
            )),
        },
    }
}

fn rgb(given: Given) -> Result<[u8; 3], String> {
    let channel = |v: f64| whole(v, 255.0, "fill").map(|v| v as u8);
    match given {
        Given::One(v) => Ok([channel(v)?; 3]),
        Given::List(l) => match l[..] {
            [v] => Ok([channel(v)?; 3]),
            [r, g, b] => Ok([channel(r)?, channel(g)?, channel(b)?]),
            _ => Err(format!("fill: one value for every channel or [r, g, b]; got {} values", l.len())),
        },
    }
}

/// A whole number in `0..=max`.
fn whole(v: f64, max: f64, name: &str) -> Result<f64, String> {
    if v.fract() == 0.0 && (0.0..=max).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{name}: each value must be a whole number in 0..={max}; got {v}"))
    }
}
