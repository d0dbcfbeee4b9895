//! `threads`: a count (0: one per core) or `"auto"`, where the autoscaler sizes the pool
//! to what the trainer consumes.

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// This many worker threads; 0 means one per available core.
    Count(usize),
    /// As many as the trainer needs, between one and one per core.
    Auto,
}

impl Default for Threads {
    fn default() -> Self {
        Self::Count(0)
    }
}

impl From<usize> for Threads {
    fn from(n: usize) -> Self {
        Self::Count(n)
    }
}

impl Threads {
    /// Threads to start with: the count, or one per core for 0 and `auto` (the autoscaler
    /// then moves it).
    pub fn initial(self) -> usize {
        match self {
            Self::Count(n) if n > 0 => n,
            _ => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        }
    }

    /// The fixed count asked for; `None` for `auto`.
    pub fn count(self) -> Option<usize> {
        match self {
            Self::Count(n) => Some(n),
            Self::Auto => None,
        }
    }
}

impl fmt::Display for Threads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Count(n) => write!(f, "{n}"),
            Self::Auto => f.write_str("auto"),
        }
    }
}

impl Serialize for Threads {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Count(n) => s.serialize_u64(*n as u64),
            Self::Auto => s.serialize_str("auto"),
        }
    }
}

impl<'de> Deserialize<'de> for Threads {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ThreadsVisitor;

        impl Visitor<'_> for ThreadsVisitor {
            type Value = Threads;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a thread count (0: one per core) or \"auto\"")
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Threads, E> {
                usize::try_from(v).map(Threads::Count).map_err(|_| E::custom(format!("{v} threads is too many")))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Threads, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(format!("threads cannot be negative ({v})")))
                    .and_then(|v| self.visit_u64(v))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Threads, E> {
                match v {
                    "auto" => Ok(Threads::Auto),
                    other => Err(E::custom(format!("threads must be a count or \"auto\", not {other:?}"))),
                }
            }
        }

        d.deserialize_any(ThreadsVisitor)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_count_or_auto_round_trips_and_anything_else_is_refused() {
        for (json, t) in [("0", Threads::Count(0)), ("6", Threads::Count(6)), ("\"auto\"", Threads::Auto)] {
            assert_eq!(serde_json::from_str::<Threads>(json).unwrap(), t);
            assert_eq!(serde_json::to_string(&t).unwrap(), json);
        }
        let e = serde_json::from_str::<Threads>("\"many\"").unwrap_err().to_string();
        assert!(e.contains("threads must be a count or \"auto\", not \"many\""), "{e}");
        assert!(serde_json::from_str::<Threads>("-2").is_err());
        assert_eq!(
            toml::from_str::<std::collections::HashMap<String, Threads>>("t = \"auto\"").unwrap()["t"],
            Threads::Auto
        );
    }
}
