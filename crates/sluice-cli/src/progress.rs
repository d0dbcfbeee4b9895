//! Progress bars on stderr (hidden when stderr is not a terminal).

use indicatif::{ProgressBar, ProgressStyle};

pub fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    let style = ProgressStyle::with_template(&format!(
        "{{spinner}} {what} [{{bar:30}}] {{pos}}/{{len}} {{per_sec}} eta {{eta}}"
    ))
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    pb.set_style(style);
    pb
}
