//! How sluice's programs write their logs: one rule for the `sluice` and `sluice-bench`
//! commands and the Python binding's `enable_logging`.

use std::io::IsTerminal;

/// Whether log lines on stderr may carry ANSI colour codes: only when stderr is a terminal
/// and `NO_COLOR` is unset or empty (<https://no-color.org>). A log sent to a file or a
/// pipe (`sluice run spec.toml 2> log`) stays plain text.
pub fn stderr_colours() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}
