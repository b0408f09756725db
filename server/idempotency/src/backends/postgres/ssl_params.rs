//! libpq's TLS parameters (`sslmode`, `sslrootcert`) taken out of a connection string.
//!
//! tokio-postgres parses connection strings itself but knows only `sslmode=disable|prefer|require`
//! and rejects `sslrootcert`, while libpq (and so `psql`) also takes `verify-ca`, `verify-full` and
//! a CA file. So both parameters are taken out here, from either form of the string (a
//! `postgres://` URL's query, or `key=value` pairs), decoded as tokio-postgres would decode them, and
//! [`super::tls`] gives them libpq's meaning. Everything else is left, byte for byte, for
//! tokio-postgres to parse (and to reject if it is wrong).

/// The TLS parameters of a connection string, decoded. The last occurrence of each wins, as in
/// libpq.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct SslParams {
    /// `sslmode`, as written (checked by [`super::tls`]).
    pub(crate) sslmode: Option<String>,
    /// `sslrootcert`: a PEM file, or `system`.
    pub(crate) sslrootcert: Option<String>,
}

impl SslParams {
    fn take(&mut self, key: &str, value: String) -> bool {
        match key {
            "sslmode" => self.sslmode = Some(value),
            "sslrootcert" => self.sslrootcert = Some(value),
            _ => return false,
        }
        true
    }
}

/// `url` without its `sslmode` and `sslrootcert` parameters, and those parameters. A string this
/// cannot read (a malformed key/value string) is returned whole, for tokio-postgres to report.
/// Errors: a percent-encoded TLS parameter that does not decode to UTF-8.
pub(crate) fn split(url: &str) -> Result<(String, SslParams), String> {
    for scheme in ["postgres://", "postgresql://"] {
        if url.starts_with(scheme) {
            return split_url(url, scheme.len());
        }
    }
    Ok(split_key_value(url))
}

/// The URL form: `postgres://user:password@host:port/db?key=value&key=value`. The query starts at
/// the first `?` after the credentials (which end at the first `@`), as tokio-postgres reads it.
fn split_url(url: &str, scheme_len: usize) -> Result<(String, SslParams), String> {
    let after_scheme = &url[scheme_len..];
    let creds_end = after_scheme.find('@').map_or(0, |i| i + 1);
    let Some(q) = after_scheme[creds_end..].find('?') else {
        return Ok((url.to_string(), SslParams::default()));
    };
    let query_start = scheme_len + creds_end + q;
    let (head, query) = (&url[..query_start], &url[query_start + 1..]);
    let mut params = SslParams::default();
    let mut kept = Vec::new();
    for pair in query.split('&') {
        let taken = match pair.split_once('=') {
            Some((key, value)) => {
                let key = percent_decode(key).unwrap_or_default();
                if key == "sslmode" || key == "sslrootcert" {
                    let value = percent_decode(value)
                        .ok_or_else(|| format!("{key}: invalid percent-encoding or not UTF-8"))?;
                    params.take(&key, value)
                } else {
                    false
                }
            }
            None => false,
        };
        if !taken {
            kept.push(pair);
        }
    }
    let mut rest = head.to_string();
    if !kept.is_empty() {
        rest.push('?');
        rest.push_str(&kept.join("&"));
    }
    Ok((rest, params))
}

/// `%XX` sequences decoded by percent-encoding (as tokio-postgres decodes URL parts; `+` stays
/// `+`). `None` when the result is not UTF-8 or a `%` is not followed by two hex digits: where
/// percent-encoding would keep such a `%` as it is, a TLS parameter is refused rather than guessed.
fn percent_decode(s: &str) -> Option<String> {
    let well_formed = s.split('%').skip(1).all(|after| {
        after
            .as_bytes()
            .get(..2)
            .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    });
    if !well_formed {
        return None;
    }
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(std::borrow::Cow::into_owned)
}

/// The key/value form: `host=db sslmode=verify-full sslrootcert='/etc/ca dir/ca.pem'`, with
/// whitespace around `=` allowed, values single-quoted or not, and `\` escaping the next character.
fn split_key_value(s: &str) -> (String, SslParams) {
    let Some(pairs) = key_value_pairs(s) else {
        return (s.to_string(), SslParams::default());
    };
    let mut params = SslParams::default();
    let mut rest = String::with_capacity(s.len());
    let mut copied_to = 0;
    for pair in pairs {
        if params.take(pair.key, pair.value) {
            rest.push_str(&s[copied_to..pair.start]);
            copied_to = pair.end;
        }
    }
    rest.push_str(&s[copied_to..]);
    (rest.trim().to_string(), params)
}

struct Pair<'a> {
    key: &'a str,
    value: String,
    /// Byte range of `key = value` in the string.
    start: usize,
    end: usize,
}

/// Every `key=value` of `s`, as tokio-postgres's parser reads them; `None` if `s` is malformed.
fn key_value_pairs(s: &str) -> Option<Vec<Pair<'_>>> {
    let mut pairs = Vec::new();
    let mut it = s.char_indices().peekable();
    let skip_ws = |it: &mut std::iter::Peekable<std::str::CharIndices<'_>>| {
        while it.next_if(|&(_, c)| c.is_whitespace()).is_some() {}
    };
    loop {
        skip_ws(&mut it);
        let Some(&(start, _)) = it.peek() else { break };
        while it
            .next_if(|&(_, c)| !c.is_whitespace() && c != '=')
            .is_some()
        {}
        let key_end = it.peek().map_or(s.len(), |&(i, _)| i);
        if key_end == start {
            return None;
        }
        skip_ws(&mut it);
        it.next_if(|&(_, c)| c == '=')?;
        skip_ws(&mut it);
        let mut value = String::new();
        if it.next_if(|&(_, c)| c == '\'').is_some() {
            loop {
                match it.next()? {
                    (_, '\'') => break,
                    (_, '\\') => value.push(it.next()?.1),
                    (_, c) => value.push(c),
                }
            }
        } else {
            while let Some((_, c)) = it.next_if(|&(_, c)| !c.is_whitespace()) {
                if c == '\\' {
                    if let Some((_, escaped)) = it.next() {
                        value.push(escaped);
                    }
                } else {
                    value.push(c);
                }
            }
            if value.is_empty() {
                return None;
            }
        }
        let end = it.peek().map_or(s.len(), |&(i, _)| i);
        pairs.push(Pair {
            key: &s[start..key_end],
            value,
            start,
            end,
        });
    }
    Some(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(mode: Option<&str>, root: Option<&str>) -> SslParams {
        SslParams {
            sslmode: mode.map(str::to_string),
            sslrootcert: root.map(str::to_string),
        }
    }

    #[test]
    fn a_urls_tls_parameters_are_taken_out_and_the_rest_is_kept_in_order() {
        let (rest, p) = split(
            "postgres://app:pw@db:5432/pay?connect_timeout=2&sslmode=verify-full&sslrootcert=/etc/ca.pem&application_name=x",
        )
        .unwrap();
        assert_eq!(
            rest,
            "postgres://app:pw@db:5432/pay?connect_timeout=2&application_name=x"
        );
        assert_eq!(p, params(Some("verify-full"), Some("/etc/ca.pem")));
        let parsed: tokio_postgres::Config = rest.parse().expect("the rest parses");
        assert_eq!(parsed.get_application_name(), Some("x"));
    }

    #[test]
    fn a_url_with_only_tls_parameters_loses_its_question_mark() {
        let (rest, p) =
            split("postgresql://app@db/pay?sslmode=verify-ca&sslrootcert=%2Ftmp%2Fmy%20ca.pem")
                .unwrap();
        assert_eq!(rest, "postgresql://app@db/pay");
        assert_eq!(p, params(Some("verify-ca"), Some("/tmp/my ca.pem")));
    }

    #[test]
    fn a_question_mark_in_the_password_does_not_start_the_query() {
        let (rest, p) = split("postgres://app:pa?ss@db/pay?sslmode=require").unwrap();
        assert_eq!(rest, "postgres://app:pa?ss@db/pay");
        assert_eq!(p, params(Some("require"), None));
    }

    #[test]
    fn a_url_without_tls_parameters_is_unchanged() {
        for url in [
            "postgres://app:pw@db/pay",
            "postgres://app:pw@db-a,db-b/pay?target_session_attrs=read-write",
        ] {
            assert_eq!(split(url).unwrap(), (url.to_string(), SslParams::default()));
        }
    }

    #[test]
    fn the_last_occurrence_wins() {
        let (_, p) = split("postgres://db/pay?sslmode=disable&sslmode=verify-full").unwrap();
        assert_eq!(p.sslmode.as_deref(), Some("verify-full"));
    }

    #[test]
    fn a_badly_encoded_tls_parameter_is_an_error() {
        assert!(split("postgres://db/pay?sslrootcert=%zz").is_err());
        assert!(split("postgres://db/pay?sslrootcert=%ff").is_err());
    }

    #[test]
    fn key_value_tls_parameters_are_taken_out_quoted_or_not() {
        let (rest, p) = split(
            "host=db  sslmode = verify-full user=app sslrootcert='/etc/my ca\\'s.pem' dbname=pay",
        )
        .unwrap();
        assert_eq!(rest, "host=db   user=app  dbname=pay");
        assert_eq!(p, params(Some("verify-full"), Some("/etc/my ca's.pem")));
        let parsed: tokio_postgres::Config = rest.parse().expect("the rest parses");
        assert_eq!(parsed.get_dbname(), Some("pay"));
    }

    #[test]
    fn a_key_value_string_without_tls_parameters_is_unchanged() {
        let s = "host=db user=app password='a b' dbname=pay";
        assert_eq!(split(s).unwrap(), (s.to_string(), SslParams::default()));
    }

    #[test]
    fn a_malformed_key_value_string_is_left_whole_for_tokio_postgres_to_report() {
        for s in [
            "host=db sslmode",
            "host=db sslrootcert='/unterminated",
            "=x",
        ] {
            assert_eq!(split(s).unwrap(), (s.to_string(), SslParams::default()));
        }
    }
}
