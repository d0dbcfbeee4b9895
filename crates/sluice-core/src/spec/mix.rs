//! A mixed source: several sources, each with a weight, drawn in those proportions in
//! every batch (`[source] kind = "mix"`, `sources = [{kind = ..., weight = 0.7}, ...]`).
//! The order itself is the sampler's (`sluice_pipeline::sampler::mix_order`).

use serde::de::Error as _;
use serde::ser::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::SourceSpec;
use crate::SpecError;

/// Most sources one mix may name.
pub const MAX_MIXED_SOURCES: usize = 64;

/// One source of a mix and its weight. Written as the source's own table plus `weight`:
/// `{kind = "image_folder", root = "a", weight = 0.7}`. Weights are relative (they need
/// not add up to 1).
#[derive(Debug, Clone, PartialEq)]
pub struct MixedSource {
    pub source: SourceSpec,
    pub weight: f64,
}

impl Serialize for MixedSource {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut value = serde_json::to_value(&self.source).map_err(S::Error::custom)?;
        if let Some(table) = value.as_object_mut() {
            table.insert("weight".into(), serde_json::Value::from(self.weight));
        }
        value.serialize(s)
    }
}

impl<'de> Deserialize<'de> for MixedSource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut value = serde_json::Value::deserialize(d)?;
        let table = value.as_object_mut().ok_or_else(|| D::Error::custom("a mixed source is a table"))?;
        let weight = match table.remove("weight") {
            Some(w) => w.as_f64().ok_or_else(|| D::Error::custom("`weight` must be a number"))?,
            None => return Err(D::Error::custom("a mixed source needs a `weight`")),
        };
        let source = SourceSpec::deserialize(value).map_err(D::Error::custom)?;
        Ok(Self { source, weight })
    }
}

/// Checks a mix: 1 to [`MAX_MIXED_SOURCES`] sources, none of them a mix, each with a
/// positive finite weight.
pub(super) fn validate(sources: &[MixedSource]) -> Result<(), SpecError> {
    if sources.is_empty() || sources.len() > MAX_MIXED_SOURCES {
        return Err(SpecError::new("source.sources", format!("needs 1 to {MAX_MIXED_SOURCES} sources")));
    }
    for (i, s) in sources.iter().enumerate() {
        if !(s.weight > 0.0 && s.weight.is_finite()) {
            return Err(SpecError::new(
                format!("source.sources[{i}].weight"),
                format!("must be a positive number; got {}", s.weight),
            ));
        }
        if matches!(s.source, SourceSpec::Mix { .. }) {
            return Err(SpecError::new(format!("source.sources[{i}]"), "a mix cannot hold another mix"));
        }
        if s.source.has_boxes() {
            return Err(SpecError::new(format!("source.sources[{i}]"), "sources with boxes cannot be mixed yet"));
        }
        s.source.validate().map_err(|e| SpecError::new(format!("source.sources[{i}]"), e.to_string()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::PipelineSpec;

    /// A spec of a mix of `sources` (TOML inline tables), preceded by `top` (top-level keys).
    fn mix_spec(top: &str, sources: &[&str]) -> Result<PipelineSpec, SpecError> {
        PipelineSpec::from_toml_str(&format!(
            "{top}\nops = [{{ op = \"decode\" }}, {{ op = \"center_crop\", size = 8 }}]\n[batch]\nsize = 4\n\
             [source]\nkind = \"mix\"\nsources = [{}]\n",
            sources.join(", ")
        ))
    }

    #[test]
    fn a_source_with_boxes_is_refused_in_a_mix_rather_than_losing_its_boxes() {
        let sources = [
            r#"{ kind = "image_folder", root = "/a", weight = 1 }"#,
            r#"{ kind = "sidecar", root = "/b", weight = 1 }"#,
        ];
        let err = mix_spec("", &sources).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("source.sources[1]") && err.contains("boxes"), "{err}");
    }

    #[test]
    fn fields_in_a_mix_need_every_source_to_carry_them_naming_the_one_that_does_not() {
        let fields = r#"fields = [{ name = "id", kind = "int" }]"#;
        let parquet = r#"{ kind = "parquet", path = "/a.parquet", weight = 1 }"#;
        assert!(mix_spec(fields, &[parquet, parquet]).is_ok());
        let err = mix_spec(fields, &[parquet, r#"{ kind = "image_folder", root = "/b", weight = 1 }"#])
            .err()
            .map(|e| (e.field, e.message))
            .unwrap_or_default();
        assert_eq!(err.0, "source.sources[1]", "{err:?}");
        assert!(err.1.contains("no metadata fields"), "{err:?}");
    }

    #[test]
    fn a_mix_reads_and_writes_as_the_sources_own_tables_plus_weight() {
        let sources = [
            r#"{ kind = "image_folder", root = "/a", weight = 0.7 }"#,
            r#"{ kind = "tar", shards = ["/b.tar"], weight = 3 }"#,
        ];
        let spec = mix_spec("", &sources).unwrap_or_else(|e| panic!("{e}"));
        let SourceSpec::Mix { sources } = &spec.source else { panic!("not a mix: {:?}", spec.source) };
        assert_eq!(
            sources[0],
            MixedSource { source: SourceSpec::ImageFolder { root: PathBuf::from("/a") }, weight: 0.7 }
        );
        assert_eq!(sources[1].weight, 3.0);
        let json = spec.to_json_string().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(PipelineSpec::from_json_str(&json).unwrap_or_else(|e| panic!("{e}")), spec);
        let toml = spec.to_toml_string().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(PipelineSpec::from_toml_str(&toml).unwrap_or_else(|e| panic!("{e}")), spec);
    }

    #[test]
    fn a_relative_root_in_a_mix_is_taken_from_the_spec_folder() {
        let mut source = SourceSpec::Mix {
            sources: vec![MixedSource { source: SourceSpec::ImageFolder { root: PathBuf::from("a") }, weight: 1.0 }],
        };
        source.resolve_relative(std::path::Path::new("/specs"));
        let SourceSpec::Mix { sources } = source else { panic!("not a mix") };
        assert_eq!(sources[0].source, SourceSpec::ImageFolder { root: PathBuf::from("/specs/a") });
    }
}
