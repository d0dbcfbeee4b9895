//! A TurboJPEG handle for the one-shot jobs (encoding, lossless transforms): created per
//! call, destroyed on drop. The decoder keeps its own long-lived handle (`jpeg.rs`).

use std::ffi::CStr;
use std::ptr::NonNull;

use libc::{c_int, c_void};
use turbojpeg_sys as tj;

use crate::error::CodecError;

pub(crate) struct TjHandle(NonNull<c_void>);

impl Drop for TjHandle {
    fn drop(&mut self) {
        // SAFETY: from tj3Init, destroyed once.
        unsafe { tj::tj3Destroy(self.0.as_ptr()) }
    }
}

impl TjHandle {
    /// `kind` is a `TJINIT` value; `what` names it in the error.
    pub(crate) fn new(kind: tj::TJINIT, what: &str) -> Result<Self, CodecError> {
        // SAFETY: no preconditions; NULL on failure.
        let raw = unsafe { tj::tj3Init(kind as c_int) };
        NonNull::new(raw)
            .map(Self)
            .ok_or_else(|| CodecError::Unsupported(format!("cannot create a libjpeg-turbo {what}")))
    }

    pub(crate) fn as_ptr(&self) -> *mut c_void {
        self.0.as_ptr()
    }

    /// The handle's last error, on one line.
    pub(crate) fn message(&self) -> String {
        // SAFETY: valid handle; NUL-terminated string, copied at once.
        let p = unsafe { tj::tj3GetErrorStr(self.0.as_ptr()) };
        if p.is_null() {
            return "unknown libjpeg-turbo error".into();
        }
        // SAFETY: non-null, NUL-terminated.
        let s = unsafe { CStr::from_ptr(p) };
        s.to_string_lossy().split_whitespace().collect::<Vec<_>>().join(" ")
    }

    pub(crate) fn set(&self, param: tj::TJPARAM, value: c_int) -> Result<(), CodecError> {
        // SAFETY: valid handle.
        match unsafe { tj::tj3Set(self.0.as_ptr(), param as c_int, value) } {
            0 => Ok(()),
            _ => Err(CodecError::Unsupported(format!("libjpeg-turbo setting {param}: {}", self.message()))),
        }
    }

    pub(crate) fn get(&self, param: tj::TJPARAM) -> c_int {
        // SAFETY: valid handle.
        unsafe { tj::tj3Get(self.0.as_ptr(), param as c_int) }
    }
}
