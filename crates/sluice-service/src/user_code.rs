//! What user code a client may make the service run: a job's `map` ops import
//! `module:qualname` in a worker's Python children, so the operator lists the modules a
//! job may name (`--allow-python-module NAME`, `[serve] allow_python_modules`); none by
//! default. A listed name allows that module and the modules of its package
//! (`augment` allows `augment` and `augment.color`). The dispatcher refuses a job naming
//! another module when it is submitted, and every worker refuses it again before it starts
//! a child: the worker is what runs the code, whatever its dispatcher allowed.
//!
//! The child itself (`python/sluice/map_server.py`) keeps the name to what it says: it
//! walks the qualname through no module and no dunder attribute, calls only a function
//! (or class) defined in the module named, and has no working folder on its import path.

use sluice_core::{OpSpec, PipelineSpec};

use crate::error::ServiceError;

/// The Python modules a job's `map` ops may import.
#[derive(Debug, Clone, Default)]
pub struct PythonModules {
    allowed: Vec<String>,
}

/// A dotted Python module name: identifiers separated by dots.
fn is_module_name(name: &str) -> bool {
    !name.is_empty()
        && name.split('.').all(|part| {
            let mut chars = part.chars();
            chars.next().is_some_and(|c| c.is_alphabetic() || c == '_')
                && chars.all(|c| c.is_alphanumeric() || c == '_')
        })
}

impl PythonModules {
    /// The operator's list; a name that is no module name is an error (a typo would
    /// otherwise allow nothing, silently).
    pub fn new(names: &[String]) -> Result<Self, ServiceError> {
        if let Some(bad) = names.iter().find(|n| !is_module_name(n)) {
            return Err(ServiceError::PythonModuleName { name: bad.clone() });
        }
        Ok(Self { allowed: names.to_vec() })
    }

    /// Whether a `map` op may import `module`: it, or a package above it, is listed.
    pub fn allows(&self, module: &str) -> bool {
        self.allowed.iter().any(|a| module == a || module.strip_prefix(a.as_str()).is_some_and(|r| r.starts_with('.')))
    }

    /// Refuses `spec` if one of its `map` ops names a module not allowed: the first such
    /// op, its field, its module and the flag that would allow it.
    pub fn check(&self, spec: &PipelineSpec) -> Result<(), ServiceError> {
        for (i, op) in spec.ops.iter().enumerate() {
            let OpSpec::Map { func, .. } = op else { continue };
            let module = func.split_once(':').map_or(func.as_str(), |(m, _)| m);
            if !self.allows(module) {
                return Err(ServiceError::PythonModuleNotAllowed {
                    field: format!("ops[{i}].fn"),
                    func: func.clone(),
                    module: module.to_owned(),
                    allowed: if self.allowed.is_empty() { "none".into() } else { self.allowed.join(", ") },
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::SourceSpec;

    fn spec(funcs: &[&str]) -> PipelineSpec {
        let mut s = PipelineSpec::train_default(SourceSpec::ImageFolder { root: "/data".into() }, 32, 4);
        s.ops.extend(funcs.iter().map(|f| OpSpec::map(*f)));
        s
    }

    #[test]
    fn a_map_op_runs_only_a_module_the_operator_listed_and_the_error_names_it_and_the_flag() {
        let none = PythonModules::new(&[]).unwrap();
        none.check(&spec(&[])).unwrap();
        let e = none.check(&spec(&["this:nothing"])).unwrap_err().to_string();
        assert!(e.contains("`this:nothing`") && e.contains("`this`"), "{e}");
        assert!(e.contains("--allow-python-module this") && e.contains("allowed: none"), "{e}");

        let some = PythonModules::new(&["augment".into(), "service_map_fns".into()]).unwrap();
        let n = spec(&[]).ops.len();
        some.check(&spec(&["augment:blur", "augment.color:jitter", "service_map_fns:mark"])).unwrap();
        for refused in ["augmentx:blur", "os:system", "this:nothing", "augmen:f"] {
            let e = some.check(&spec(&["augment:blur", refused])).unwrap_err().to_string();
            let module = refused.split(':').next().unwrap();
            assert!(e.contains(&format!("ops[{}].fn", n + 1)) && e.contains(&format!("`{module}`")), "{e}");
            assert!(e.contains("allowed: augment, service_map_fns"), "{e}");
        }
        for bad in ["", "a..b", "os.", "1x", "a b", "m:f"] {
            let e = PythonModules::new(&[bad.into()]).unwrap_err().to_string();
            assert!(e.contains(&format!("`{bad}`")) && e.contains("--allow-python-module"), "{e}");
        }
    }
}
