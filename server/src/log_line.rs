//! The text log line, written with less work than tracing-subscriber's default `Full` format and
//! byte for byte the same line.
//!
//! Kept because it was measured: every request writes one INFO line inside its request span, and
//! that line was about a third of the user-space instructions of a new-key request and over half
//! of a replay's: a calendar conversion and a dozen `write!` calls for the timestamp, each field
//! name and `=` painted through `nu_ansi_term` even with colours off, and the message escaped one
//! character at a time. This module took 10 088 of 158 133 instructions off a new-key request and
//! 10 409 of 108 489 off a replay (callgrind, `benches/NOTEBOOK.md`, "the log line with less
//! work", 2026-12-06). It keeps tracing-subscriber (registry, filter, span storage, writer) and
//! plugs into its two documented extension points instead:
//!
//! - [`TextFields`] (`FormatFields`) writes a span's or an event's fields: `name=value` separated by
//!   spaces, values with their `Debug` form, the `message` field bare with control characters
//!   escaped exactly as tracing-subscriber escapes them (ESC, BEL, BS, FF, DEL as `\x1b` etc., C1
//!   controls as `\u{80}`); the message is checked a whole chunk at a time and only a chunk holding
//!   one of those takes the per-character path. Errors and any writer with colours on go to
//!   tracing-subscriber's own `DefaultFields`/`DefaultVisitor`, whose output they must match.
//! - [`TextLine`] (`FormatEvent`) writes `timestamp level spans: target: fields`. The timestamp
//!   (RFC 3339, UTC, microseconds, as tracing-subscriber's `SystemTime`) keeps its date and time of
//!   day per second in a thread-local and only writes the microseconds for each line. A writer with
//!   colours on (a terminal) and events bridged from the `log` crate go to the default formatter.
//!
//! The tests below print the same spans and events through both and compare the lines.

use std::cell::Cell;
use std::fmt::{self, Write as _};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::field::{RecordFields, VisitOutput};
use tracing_subscriber::fmt::format::{DefaultFields, DefaultVisitor, Format, Full, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime as SubscriberTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Field formatter of text lines (module docs).
#[derive(Debug, Default, Clone, Copy)]
pub struct TextFields;

impl<'writer> FormatFields<'writer> for TextFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        if writer.has_ansi_escapes() {
            return DefaultFields::new().format_fields(writer, fields);
        }
        let mut visitor = FieldWriter::new(writer);
        fields.record(&mut visitor);
        visitor.result
    }
}

/// Writes fields as `DefaultVisitor` does when colours are off.
struct FieldWriter<'a> {
    writer: Writer<'a>,
    is_empty: bool,
    result: fmt::Result,
}

impl<'a> FieldWriter<'a> {
    fn new(writer: Writer<'a>) -> Self {
        Self {
            writer,
            is_empty: true,
            result: Ok(()),
        }
    }

    fn pad(&mut self) -> fmt::Result {
        if self.is_empty {
            self.is_empty = false;
            Ok(())
        } else {
            self.writer.write_char(' ')
        }
    }

    /// `name=` (a raw identifier without its `r#`), after the separating space.
    fn name(&mut self, field: &Field) -> fmt::Result {
        self.pad()?;
        let name = field.name();
        self.writer
            .write_str(name.strip_prefix("r#").unwrap_or(name))?;
        self.writer.write_char('=')
    }
}

impl Visit for FieldWriter<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        let name = field.name();
        if name == "message" || name.starts_with("log.") {
            // Rare as strings (a message given as a field, tracing-log's fields): the general path.
            self.record_debug(field, &format_args!("{value}"));
        } else if self.result.is_ok() {
            // The common case (the span's scope and key): quoted, without a dynamic `Debug` call.
            self.result = self
                .name(field)
                .and_then(|()| write!(self.writer, "{value:?}"));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        if self.result.is_err() {
            return;
        }
        // Rare (failures only), and its `sources` list has a form of its own: the default's.
        let mut visitor = DefaultVisitor::new(self.writer.by_ref(), self.is_empty);
        visitor.record_error(field, value);
        self.is_empty = false;
        self.result = visitor.finish();
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.result.is_err() {
            return;
        }
        let name = field.name();
        // tracing-log's metadata fields (strings, so they come through `record_str` too), already
        // shown by the default formatter's `log` path.
        if name.starts_with("log.") {
            return;
        }
        self.result = if name == "message" {
            self.pad()
                .and_then(|()| write!(Escaping(&mut self.writer), "{value:?}"))
        } else {
            self.name(field)
                .and_then(|()| write!(self.writer, "{value:?}"))
        };
    }
}

/// Escapes what tracing-subscriber's `EscapeGuard` escapes in a message: the C0 controls that
/// start or end terminal sequences (ESC, BEL, BS, FF), DEL, and the C1 controls U+0080–U+009F.
struct Escaping<'w, 'a>(&'w mut Writer<'a>);

impl fmt::Write for Escaping<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // C1 controls are 0xC2 0x80..=0x9F in UTF-8: a chunk without these bytes needs nothing.
        if !s
            .bytes()
            .any(|b| matches!(b, 0x1b | 0x07 | 0x08 | 0x0c | 0x7f | 0xc2))
        {
            return self.0.write_str(s);
        }
        for ch in s.chars() {
            match ch {
                '\x1b' => self.0.write_str("\\x1b")?,
                '\x07' => self.0.write_str("\\x07")?,
                '\x08' => self.0.write_str("\\x08")?,
                '\x0c' => self.0.write_str("\\x0c")?,
                '\x7f' => self.0.write_str("\\x7f")?,
                '\u{80}'..='\u{9f}' => write!(self.0, "\\u{{{:x}}}", ch as u32)?,
                _ => self.0.write_char(ch)?,
            }
        }
        Ok(())
    }
}

/// Event formatter of text lines (module docs).
#[derive(Debug, Default)]
pub struct TextLine {
    /// For colours and `log` records: tracing-subscriber's own.
    fallback: Format<Full, SubscriberTime>,
}

impl<S, N> FormatEvent<S, N> for TextLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        if writer.has_ansi_escapes() || meta.fields().field("log.target").is_some() {
            return self.fallback.format_event(ctx, writer, event);
        }
        write_timestamp(&mut writer, SystemTime::now())?;
        writer.write_str(level_str(*meta.level()))?;
        if let Some(scope) = ctx.event_scope() {
            let mut seen = false;
            for span in scope.from_root() {
                seen = true;
                writer.write_str(span.metadata().name())?;
                let extensions = span.extensions();
                if let Some(fields) = extensions.get::<FormattedFields<N>>()
                    && !fields.is_empty()
                {
                    writer.write_char('{')?;
                    writer.write_str(fields)?;
                    writer.write_char('}')?;
                }
                writer.write_char(':')?;
            }
            if seen {
                writer.write_char(' ')?;
            }
        }
        writer.write_str(meta.target())?;
        writer.write_str(": ")?;
        let mut fields = FieldWriter::new(writer.by_ref());
        event.record(&mut fields);
        fields.result?;
        writer.write_char('\n')
    }
}

/// The level and the space after it, padded to five characters as the default formats it.
fn level_str(level: Level) -> &'static str {
    match level {
        Level::TRACE => "TRACE ",
        Level::DEBUG => "DEBUG ",
        Level::INFO => " INFO ",
        Level::WARN => " WARN ",
        _ => "ERROR ",
    }
}

thread_local! {
    /// The second last formatted on this thread and its `YYYY-MM-DDTHH:MM:SS.` text.
    static SECOND: Cell<(u64, [u8; 20])> = const { Cell::new((u64::MAX, [0; 20])) };
}

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ ` (UTC), as tracing-subscriber's `SystemTime` writes it, or `None`
/// for a clock outside 1970–9999 (which humantime does not format): the caller then asks
/// tracing-subscriber's own clock formatter.
fn timestamp(now: SystemTime) -> Option<[u8; 28]> {
    let since_epoch = now.duration_since(UNIX_EPOCH).ok()?;
    let secs = since_epoch.as_secs();
    let (cached, mut prefix) = SECOND.get();
    if cached != secs {
        let whole = UNIX_EPOCH.checked_add(std::time::Duration::from_secs(secs))?;
        // `YYYY-MM-DDTHH:MM:SSZ`; the `Z` becomes the decimal point. `write!` rather than
        // `to_string`, which would panic on the error humantime returns past year 9999.
        let mut text = String::with_capacity(20);
        write!(text, "{}", humantime::format_rfc3339_seconds(whole)).ok()?;
        prefix[..19].copy_from_slice(text.as_bytes().get(..19)?);
        prefix[19] = b'.';
        SECOND.set((secs, prefix));
    }
    let mut line = [0u8; 28];
    line[..20].copy_from_slice(&prefix);
    let mut micros = since_epoch.subsec_micros();
    for digit in line[20..26].iter_mut().rev() {
        *digit = b'0' + (micros % 10) as u8;
        micros /= 10;
    }
    line[26] = b'Z';
    line[27] = b' ';
    Some(line)
}

/// The line's timestamp and the space after it.
fn write_timestamp(writer: &mut Writer<'_>, now: SystemTime) -> fmt::Result {
    // ASCII throughout (humantime writes digits, '-', ':' and 'T'), so `from_utf8` succeeds.
    match timestamp(now)
        .as_ref()
        .map(|line| std::str::from_utf8(line))
    {
        Some(Ok(text)) => writer.write_str(text),
        _ => {
            SubscriberTime.format_time(writer)?;
            writer.write_char(' ')
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tracing::{debug_span, error, error_span, info, info_span, warn};
    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    /// Collects everything written, for comparing two subscribers' output.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Captured {
        fn lines(&self) -> Vec<String> {
            let bytes = self.0.lock().map(|b| b.clone()).unwrap_or_default();
            String::from_utf8_lossy(&bytes)
                .lines()
                .map(str::to_owned)
                .collect()
        }
    }

    impl io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if let Ok(mut b) = self.0.lock() {
                b.extend_from_slice(buf);
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Captured {
        type Writer = Captured;
        fn make_writer(&'w self) -> Self::Writer {
            self.clone()
        }
    }

    #[derive(Debug)]
    struct Failure(&'static str, Option<Box<Failure>>);

    impl fmt::Display for Failure {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Failure {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    /// Spans and events of every kind of field the server logs, and the awkward ones.
    fn script() {
        info!("outside any span");
        let request = error_span!(
            "request",
            request_id = %"0b9e-77",
            method = %"POST",
            route = %"/payments",
            scope = tracing::field::Empty,
            key = tracing::field::Empty,
        );
        let _entered = request.enter();
        info!(status = 201, "before the scope is recorded");
        request.record("scope", "acct_a");
        request.record("key", "k-\"quoted\"\n");
        info!(payment_id = %"pay_1", charge_id = %"ch_1", "payment created");
        warn!(
            r#type = "raw",
            flag = true,
            big = u64::MAX,
            neg = -7i64,
            ratio = 0.5,
            "raw name"
        );
        info!(message = "a message given as a string field", x = 1);
        info!("control characters: \x1b[31m red \x07 \x08 \x0c \x7f \u{85} \u{9f} é ✓");
        info!(debugged = ?Some("x"), "with a Debug value");
        let failure = Failure("outer", Some(Box::new(Failure("inner", None))));
        error!(
            error = &failure as &(dyn std::error::Error + 'static),
            "failed"
        );
        let plain = Failure("alone", None);
        error!(
            error = &plain as &(dyn std::error::Error + 'static),
            "failed alone"
        );
        info!(field_only = 3);
        let inner = info_span!("inner", depth = 2);
        let _inner = inner.enter();
        info!("nested");
        let empty = debug_span!("empty");
        let _empty = empty.enter();
        info!("in a span without fields");
    }

    /// Each line without its leading timestamp.
    fn without_time(lines: Vec<String>) -> Vec<String> {
        lines
            .into_iter()
            .map(|l| {
                l.split_once(' ')
                    .map_or(l.clone(), |(_, rest)| rest.to_owned())
            })
            .collect()
    }

    #[test]
    fn text_lines_are_the_default_full_format_byte_for_byte() {
        let expected = Captured::default();
        let default = tracing_subscriber::fmt()
            .with_max_level(Level::TRACE)
            .with_ansi(false)
            .with_writer(expected.clone())
            .finish();
        tracing::subscriber::with_default(default, script);

        let ours = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(Level::TRACE)
            .with_ansi(false)
            .with_writer(ours.clone())
            .fmt_fields(TextFields)
            .event_format(TextLine::default())
            .finish();
        tracing::subscriber::with_default(subscriber, script);

        let (expected, ours) = (expected.lines(), ours.lines());
        assert_eq!(expected.len(), 12, "{expected:#?}");
        assert_eq!(without_time(ours), without_time(expected));
    }

    #[test]
    fn records_of_the_log_crate_keep_their_own_target_and_fields() {
        // The binary's `try_init` forwards `log` records (tokio-postgres's) as events whose
        // metadata tracing-log rewrites; the default formatter shows the record's target.
        tracing_log::LogTracer::init().ok();
        log::set_max_level(log::LevelFilter::Trace);
        let emit = || {
            log::warn!(target: "tokio_postgres::connection", "server said: \x1b[2J {}", 42);
        };
        let expected = Captured::default();
        let default = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(expected.clone())
            .finish();
        tracing::subscriber::with_default(default, emit);
        let ours = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(ours.clone())
            .fmt_fields(TextFields)
            .event_format(TextLine::default())
            .finish();
        tracing::subscriber::with_default(subscriber, emit);

        let (expected, ours) = (expected.lines(), ours.lines());
        assert_eq!(expected.len(), 1, "{expected:#?}");
        assert!(
            expected[0].contains("tokio_postgres::connection"),
            "{expected:?}"
        );
        assert_eq!(without_time(ours), without_time(expected));
    }

    #[test]
    fn timestamps_are_rfc3339_utc_with_microseconds() {
        let at = |secs: u64, micros: u64| {
            let t = UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros);
            let mut s = String::new();
            write_timestamp(&mut Writer::new(&mut s), t).map(|()| s)
        };
        assert_eq!(at(0, 7).as_deref(), Ok("1970-01-01T00:00:00.000007Z "));
        assert_eq!(
            at(1_796_594_764, 844_779).as_deref(),
            Ok("2026-12-06T22:06:04.844779Z ")
        );
        // The next second on the same thread is not served from the cached one.
        assert_eq!(
            at(1_796_594_765, 0).as_deref(),
            Ok("2026-12-06T22:06:05.000000Z ")
        );
        // Leap day, and back to an earlier second.
        assert_eq!(
            at(1_709_164_800, 999_999).as_deref(),
            Ok("2024-02-29T00:00:00.999999Z ")
        );
        assert_eq!(at(0, 0).as_deref(), Ok("1970-01-01T00:00:00.000000Z "));
    }

    #[test]
    fn a_clock_outside_what_humantime_formats_falls_back_to_the_default_clock_text() {
        // Before 1970 and after 9999 (humantime's error there would panic through `to_string`).
        assert_eq!(timestamp(UNIX_EPOCH - Duration::from_secs(1)), None);
        assert_eq!(
            timestamp(UNIX_EPOCH + Duration::from_secs(253_402_300_800)),
            None
        );
        let mut s = String::new();
        let written = write_timestamp(
            &mut Writer::new(&mut s),
            UNIX_EPOCH - Duration::from_secs(1),
        );
        assert_eq!(written, Ok(()));
        assert!(s.ends_with("Z "), "{s}");
    }

    #[test]
    fn timestamps_match_the_default_formatters_clock_text() {
        let mut theirs = String::new();
        SubscriberTime
            .format_time(&mut Writer::new(&mut theirs))
            .ok();
        let mut ours = String::new();
        write_timestamp(&mut Writer::new(&mut ours), SystemTime::now()).ok();
        // Same shape, same second (unless the test straddles one, which the prefix check allows).
        assert_eq!(theirs.len() + 1, ours.len(), "{theirs} / {ours}");
        assert_eq!(theirs[..16], ours[..16], "{theirs} / {ours}");
    }
}
