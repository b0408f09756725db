//! Which request paths route rules can be trusted to judge: those in one normal form.
//!
//! Upstreams do not read a path the way it is spelled. Most decode percent-encoded characters
//! before routing (`/%70ayments` is `/payments`), remove dot segments (`/x/../payments`), some
//! merge repeated slashes (nginx, Werkzeug, Go's `ServeMux` redirect), treat `%2F` or `\` as a
//! separator, or cut `;parameters` off each segment (servlet containers read `/x/..;/payments` as
//! `/payments`). A rule that matched the spelling while the upstream routes the reading could be
//! evaded: `key = "required"` skipped by writing the path another way.
//!
//! The proxy therefore refuses (400 problem+json, nothing forwarded) a request whose method some
//! route rule names when its path is not in normal form, rather than rewriting it: the path the
//! rules judged, the path in the fingerprint and the path the upstream gets stay one string, and
//! that string has one reading. Refusing is safer than normalising because the proxy cannot know
//! every upstream's normalisation; a path that needs none has the same meaning to all of them.
//! Normal form means no:
//! - dot segment (`.` or `..`, also before a `;parameter`, as in `..;`);
//! - percent-encoded unreserved character (`A-Z a-z 0-9 - . _ ~`, RFC 3986 section 2.3): its
//!   normal form is the character itself, so `%70` and `%2E` are refused;
//! - percent-encoded `/` or `\` (`%2F`, `%5C`, either case), a raw `\`, or `%00`;
//! - percent-encoded `0xC0`/`0xC1` (the lead bytes of overlong UTF-8 forms of ASCII);
//! - malformed escape (`%` not followed by two hex digits);
//! - empty segment before the last (`//`); a trailing `/` is allowed, and rule matching reads a
//!   path with and without it (see [`crate::routes`]).
//!
//! Letter case and `;parameters` are not refused: [`crate::routes`] matches literal segments
//! ignoring ASCII case and also with each segment's `;…` part removed, so a rule covers every such
//! reading (it may then apply to a path a case-sensitive upstream treats as another one: more
//! protection, never less). Other percent-encodings (`%20`, `%25`, UTF-8) are left as they are:
//! decoding them yields no `/`, dot segment or rule literal a rule could miss.
//!
//! Methods no rule names are not checked: their route does not depend on the path.

/// Why a path is not in normal form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotNormal {
    /// A `.` or `..` segment.
    #[error("the path has a '.' or '..' segment")]
    DotSegment,
    /// A percent-encoded unreserved character.
    #[error("the path percent-encodes {0:?}, which must be written as itself")]
    EncodedUnreserved(char),
    /// `%2F`, `%5C`, `\` or `%00`.
    #[error("the path has an encoded or alternative separator ('%2F', '%5C', '\\') or '%00'")]
    Separator,
    /// `%C0` or `%C1`.
    #[error("the path has an overlong UTF-8 escape ('%C0', '%C1')")]
    Overlong,
    /// `%` without two hex digits.
    #[error("the path has a malformed percent-escape")]
    MalformedEscape,
    /// `//`.
    #[error("the path has an empty segment ('//')")]
    EmptySegment,
}

/// Checks that `path` (without its query) is in normal form (see the module docs).
pub fn check(path: &str) -> Result<(), NotNormal> {
    let Some(body) = path.strip_prefix('/') else {
        // `*` (OPTIONS) or an authority: no rule pattern can match it.
        return Ok(());
    };
    let bytes = body.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => return Err(NotNormal::Separator),
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).ok_or(NotNormal::MalformedEscape)?;
                let text = std::str::from_utf8(hex).map_err(|_| NotNormal::MalformedEscape)?;
                // `from_str_radix` accepts a sign: both characters must be hex digits.
                if !hex.iter().all(u8::is_ascii_hexdigit) {
                    return Err(NotNormal::MalformedEscape);
                }
                let byte = u8::from_str_radix(text, 16).map_err(|_| NotNormal::MalformedEscape)?;
                match byte {
                    b'/' | b'\\' | 0 => return Err(NotNormal::Separator),
                    0xC0 | 0xC1 => return Err(NotNormal::Overlong),
                    b if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') => {
                        return Err(NotNormal::EncodedUnreserved(char::from(b)));
                    }
                    _ => {}
                }
                i += 3;
            }
            _ => i += 1,
        }
    }
    let segments: Vec<&str> = body.split('/').collect();
    let last = segments.len() - 1;
    for (n, segment) in segments.iter().enumerate() {
        if segment.is_empty() && n != last {
            return Err(NotNormal::EmptySegment);
        }
        let bare = segment.split(';').next().unwrap_or(segment);
        if bare == "." || bare == ".." {
            return Err(NotNormal::DotSegment);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_in_normal_form_pass() {
        for path in [
            "/",
            "/payments/card",
            "/payments/card/",
            "/orders/a%20b",
            "/orders/caf%C3%A9",
            "/orders/100%25",
            "/orders/a;v=1",
            "/Payments/Card",
            "/a.b/..c/...",
            "*",
        ] {
            assert_eq!(check(path), Ok(()), "{path}");
        }
    }

    #[test]
    fn dot_segments_are_refused_also_before_parameters() {
        for path in [
            "/payments/./card",
            "/x/../payments/card",
            "/payments/x/..",
            "/.",
            "/x/..;/payments/card",
            "/x/.;a/payments",
        ] {
            assert_eq!(check(path), Err(NotNormal::DotSegment), "{path}");
        }
    }

    #[test]
    fn encoded_unreserved_characters_are_refused_in_either_hex_case() {
        assert_eq!(
            check("/%70ayments/card"),
            Err(NotNormal::EncodedUnreserved('p'))
        );
        assert_eq!(
            check("/x/%2e%2E/payments"),
            Err(NotNormal::EncodedUnreserved('.'))
        );
        assert_eq!(check("/a%7Eb"), Err(NotNormal::EncodedUnreserved('~')));
        assert_eq!(check("/a%5fb"), Err(NotNormal::EncodedUnreserved('_')));
    }

    #[test]
    fn encoded_and_alternative_separators_are_refused() {
        for path in [
            "/payments%2Fcard",
            "/payments%2fcard",
            "/payments%5Ccard",
            "/payments\\card",
            "/payments%00",
        ] {
            assert_eq!(check(path), Err(NotNormal::Separator), "{path}");
        }
        assert_eq!(check("/%C0%AE%C0%AE/x"), Err(NotNormal::Overlong));
    }

    #[test]
    fn malformed_escapes_and_empty_segments_are_refused() {
        for path in ["/a%", "/a%2", "/a%zz", "/a%+1", "/a%u0070"] {
            assert_eq!(check(path), Err(NotNormal::MalformedEscape), "{path}");
        }
        for path in ["//payments/card", "/payments//card"] {
            assert_eq!(check(path), Err(NotNormal::EmptySegment), "{path}");
        }
    }
}
