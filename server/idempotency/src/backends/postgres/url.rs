//! Database URLs in logs and errors: the password never leaves this module.

/// `url` with its password replaced by `***`, for logs and error messages.
///
/// Handles URLs (`postgres://user:secret@host:5432/db?password=secret`) and key/value connection
/// strings (`host=db user=app password=secret dbname=app`). A URL's query keeps only its parameter
/// names that carry no secret; `password` values become `***` wherever they appear.
pub fn redacted_url(url: &str) -> String {
    let trimmed = url.trim();
    match trimmed.split_once("://") {
        Some((scheme, rest)) => {
            let (main, query) = match rest.split_once('?') {
                Some((m, q)) => (m, Some(q)),
                None => (rest, None),
            };
            // The credentials end at the LAST '@' before the path: a password may hold '@' when not
            // percent-encoded.
            let (authority, path) = match main.find('/') {
                Some(i) => main.split_at(i),
                None => (main, ""),
            };
            let authority = match authority.rsplit_once('@') {
                Some((creds, hosts)) => match creds.split_once(':') {
                    Some((user, _password)) => format!("{user}:***@{hosts}"),
                    None => format!("{creds}@{hosts}"),
                },
                None => authority.to_string(),
            };
            let mut out = format!("{scheme}://{authority}{path}");
            if let Some(query) = query {
                let params: Vec<String> = query
                    .split('&')
                    .map(|p| match p.split_once('=') {
                        Some((k, _)) if is_secret(k) => format!("{k}=***"),
                        _ => p.to_string(),
                    })
                    .collect();
                out.push('?');
                out.push_str(&params.join("&"));
            }
            out
        }
        None => redact_key_value(trimmed),
    }
}

fn is_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name == "password" || name == "sslpassword" || name == "passfile"
}

/// `key=value` pairs separated by spaces; values may be single-quoted with `\'` escapes.
fn redact_key_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while !rest.is_empty() {
        let Some(eq) = rest.find('=') else {
            out.push_str(rest);
            break;
        };
        let key = &rest[..eq];
        out.push_str(key);
        out.push('=');
        let after = rest[eq + 1..].trim_start();
        // The value: quoted, or up to the next whitespace.
        let (value_len, quoted) = if let Some(body) = after.strip_prefix('\'') {
            let mut escaped = false;
            let mut end = body.len();
            for (i, c) in body.char_indices() {
                match c {
                    '\\' if !escaped => escaped = true,
                    '\'' if !escaped => {
                        end = i;
                        break;
                    }
                    _ => escaped = false,
                }
            }
            ((end + 2).min(after.len()), true)
        } else {
            (
                after.find(char::is_whitespace).unwrap_or(after.len()),
                false,
            )
        };
        let value = &after[..value_len];
        if is_secret(key.trim()) {
            out.push_str(if quoted { "'***'" } else { "***" });
        } else {
            out.push_str(value);
        }
        rest = &after[value_len..];
        let ws = rest.len() - rest.trim_start().len();
        out.push_str(&rest[..ws]);
        rest = &rest[ws..];
    }
    out
}

/// `message` with every occurrence of `password` replaced by `***` (for text that a driver or the
/// server produced and that might quote the URL).
pub(crate) fn scrub(message: &str, password: Option<&[u8]>) -> String {
    match password.and_then(|p| std::str::from_utf8(p).ok()) {
        Some(p) if p.len() >= 3 => message.replace(p, "***"),
        _ => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_password_is_hidden() {
        let r = redacted_url("postgres://app:s3cret@db.internal:5432/payments");
        assert_eq!(r, "postgres://app:***@db.internal:5432/payments");
    }

    #[test]
    fn password_with_at_sign_and_query_password_are_hidden() {
        let r =
            redacted_url("postgresql://app:p@ss@db:5432/payments?sslmode=require&password=other");
        assert_eq!(
            r,
            "postgresql://app:***@db:5432/payments?sslmode=require&password=***"
        );
        assert!(!r.contains("p@ss") && !r.contains("other"));
    }

    #[test]
    fn url_without_password_is_unchanged() {
        assert_eq!(
            redacted_url("postgres://app@db/payments"),
            "postgres://app@db/payments"
        );
        assert_eq!(
            redacted_url("postgres://db/payments"),
            "postgres://db/payments"
        );
    }

    #[test]
    fn key_value_password_is_hidden() {
        let r = redacted_url("host=db user=app password=s3cret dbname=payments");
        assert_eq!(r, "host=db user=app password=*** dbname=payments");
        let r = redacted_url("host=db password='it\\'s secret' dbname=payments");
        assert_eq!(r, "host=db password='***' dbname=payments");
    }

    #[test]
    fn tls_parameters_stay_visible_while_the_password_is_hidden() {
        let r = redacted_url(
            "postgres://app:s3cret@db:5432/pay?sslmode=verify-full&sslrootcert=/etc/idemlog/ca.pem",
        );
        assert_eq!(
            r,
            "postgres://app:***@db:5432/pay?sslmode=verify-full&sslrootcert=/etc/idemlog/ca.pem"
        );
        let r = redacted_url(
            "host=db password=s3cret sslmode=verify-ca sslrootcert='/etc/my ca.pem' dbname=pay",
        );
        assert_eq!(
            r,
            "host=db password=*** sslmode=verify-ca sslrootcert='/etc/my ca.pem' dbname=pay"
        );
        assert!(!r.contains("s3cret"));
        assert_eq!(
            scrub("cannot read /etc/ca.pem for s3cret", Some(b"s3cret")),
            "cannot read /etc/ca.pem for ***"
        );
    }

    #[test]
    fn scrub_removes_the_password_from_text() {
        assert_eq!(scrub("bad s3cret here", Some(b"s3cret")), "bad *** here");
        assert_eq!(scrub("nothing", None), "nothing");
    }

    #[test]
    fn a_multi_host_url_for_a_primary_with_a_standby_parses_and_hides_its_password() {
        let url = "postgres://app:s3cret@db-a:5432,db-b:5433/payments?target_session_attrs=read-write&connect_timeout=2";
        let parsed: tokio_postgres::Config = url.parse().expect("multi-host URL parses");
        assert_eq!(parsed.get_hosts().len(), 2);
        assert_eq!(parsed.get_ports(), [5432, 5433]);
        assert_eq!(
            parsed.get_target_session_attrs(),
            tokio_postgres::config::TargetSessionAttrs::ReadWrite
        );
        assert_eq!(
            redacted_url(url),
            "postgres://app:***@db-a:5432,db-b:5433/payments?target_session_attrs=read-write&connect_timeout=2"
        );
    }
}
