//! Every log line goes through one call of the `log` crate: the SDK's logger
//! sends only the message to Envoy, so the target, module and file that each
//! `log::info!` site would carry stay out of the module.

/// Writes one log line at `level` (the `log` crate, then the SDK's logger).
#[inline(never)]
pub fn emit(level: log::Level, args: std::fmt::Arguments<'_>) {
    capture(&args);
    log::log!(level, "{args}");
}

macro_rules! info {
    ($($arg:tt)*) => { $crate::host::logs::emit(log::Level::Info, format_args!($($arg)*)) };
}

macro_rules! warning {
    ($($arg:tt)*) => { $crate::host::logs::emit(log::Level::Warn, format_args!($($arg)*)) };
}

macro_rules! error {
    ($($arg:tt)*) => { $crate::host::logs::emit(log::Level::Error, format_args!($($arg)*)) };
}

pub(crate) use {error, info, warning};

/// In the module, a line goes only to the host.
#[cfg(not(test))]
fn capture(_: &std::fmt::Arguments<'_>) {}

/// In a cargo test, a line is also kept for [`taken`].
#[cfg(test)]
fn capture(args: &std::fmt::Arguments<'_>) {
    LINES.with(|l| l.borrow_mut().push(args.to_string()));
}

#[cfg(test)]
thread_local! {
    /// Every line this test's thread logged.
    static LINES: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The lines logged so far on this thread (a cargo test's own), taken.
#[cfg(test)]
pub fn taken() -> Vec<String> {
    LINES.with(|l| l.take())
}
