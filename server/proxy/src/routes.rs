//! Route rules: which requests are protected, and with which settings.
//!
//! A rule matches a request by method and path pattern. Patterns are written segment by segment:
//! a literal segment matches itself, `*` matches any one segment, and a final `**` matches any
//! rest of the path, including none (`/orders/**` matches `/orders`, `/orders/1` and
//! `/orders/1/items`). The query string is not part of the match. The first rule that matches
//! wins; see [`crate::config`] for what applies when none does.
//!
//! A rule must cover every reading an upstream may give the path, or it could be evaded by
//! spelling the path another way. Spellings that change the path's structure (dot segments,
//! `%2F`, `//`, encoded unreserved characters) are refused before matching ([`crate::normal_path`]);
//! the rest are matched inclusively, so a rule applies if any common reading matches:
//! - literal segments compare ignoring ASCII case (Express and ASP.NET route case-insensitively);
//! - a segment also matches with its `;parameters` cut off (servlet containers drop them), so
//!   `/payments;a=b/card` is `/payments/*`;
//! - one trailing `/` is optional on both sides (Express and older Spring ignore it), so
//!   `/payments/card/` is `/payments/*` and `/orders` is `/orders/`.
//!
//! Inclusive matching can apply a rule to a path a strict upstream treats as another one: more
//! protection there, never less here.

use axum::http::Method;

/// A compiled path pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    text: String,
    segments: Vec<Segment>,
    /// The pattern ends with `/**`.
    rest: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Any,
}

/// Why a pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// Patterns start with `/`.
    #[error("path pattern {0:?} must start with '/'")]
    NotAbsolute(String),
    /// `**` anywhere but as the last segment, or mixed with other characters.
    #[error("path pattern {0:?}: '**' is allowed only as the whole last segment")]
    MisplacedRest(String),
    /// `*` mixed with other characters in one segment.
    #[error(
        "path pattern {0:?}: '*' must be a whole segment (partial wildcards are not supported)"
    )]
    PartialWildcard(String),
}

impl PathPattern {
    /// Compiles `text` (`/orders/*`, `/orders/**`, `/health`).
    pub fn parse(text: &str) -> Result<Self, PatternError> {
        let Some(body) = text.strip_prefix('/') else {
            return Err(PatternError::NotAbsolute(text.to_owned()));
        };
        // A trailing `/` is optional in matching: the pattern is kept without it.
        let body = body.strip_suffix('/').unwrap_or(body);
        let parts: Vec<&str> = if body.is_empty() {
            Vec::new()
        } else {
            body.split('/').collect()
        };
        let mut segments = Vec::with_capacity(parts.len());
        let mut rest = false;
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            match *part {
                "**" if last => rest = true,
                "**" => return Err(PatternError::MisplacedRest(text.to_owned())),
                "*" => segments.push(Segment::Any),
                p if p.contains("**") => return Err(PatternError::MisplacedRest(text.to_owned())),
                p if p.contains('*') => return Err(PatternError::PartialWildcard(text.to_owned())),
                p => segments.push(Segment::Literal(p.to_owned())),
            }
        }
        Ok(Self {
            text: text.to_owned(),
            segments,
            rest,
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// True if `path` (without its query) matches, in any of the readings the module docs list.
    pub fn matches(&self, path: &str) -> bool {
        let Some(body) = path.strip_prefix('/') else {
            return false;
        };
        // With and without one trailing `/` (the root `/` is the path of no segments).
        let trimmed = body.strip_suffix('/').unwrap_or(body);
        self.matches_segments(trimmed)
            || (trimmed.len() != body.len() && self.matches_segments(body))
    }

    fn matches_segments(&self, body: &str) -> bool {
        // The root `/` is no segment at all (not one empty segment).
        let mut parts = body.split('/').filter(|_| !body.is_empty());
        for segment in &self.segments {
            let Some(part) = parts.next() else {
                return false;
            };
            match segment {
                Segment::Any => {}
                Segment::Literal(literal) if literal_matches(literal, part) => {}
                Segment::Literal(_) => return false,
            }
        }
        if self.rest {
            return true;
        }
        parts.next().is_none()
    }
}

/// A literal pattern segment against a path segment: ignoring ASCII case, as written or with the
/// segment's `;parameters` cut off.
fn literal_matches(literal: &str, part: &str) -> bool {
    if literal.eq_ignore_ascii_case(part) {
        return true;
    }
    match part.split_once(';') {
        Some((bare, _)) => literal.eq_ignore_ascii_case(bare),
        None => false,
    }
}

/// A method set and a path pattern: the part of a rule that selects requests.
#[derive(Debug, Clone)]
pub struct Matcher {
    /// Methods the rule applies to.
    pub methods: Vec<Method>,
    /// The path pattern.
    pub path: PathPattern,
}

impl Matcher {
    /// True if the rule applies to this request.
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        self.methods.iter().any(|m| m == method) && self.path.matches(path)
    }
}

/// Index of the first matcher that applies, if any.
pub fn first_match<'a>(
    matchers: impl IntoIterator<Item = &'a Matcher>,
    method: &Method,
    path: &str,
) -> Option<usize> {
    matchers
        .into_iter()
        .position(|matcher| matcher.matches(method, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(text: &str) -> PathPattern {
        PathPattern::parse(text).expect("valid pattern")
    }

    #[test]
    fn an_exact_pattern_matches_only_its_path() {
        let p = pattern("/orders");
        assert!(p.matches("/orders"));
        assert!(!p.matches("/orders/1"));
        assert!(!p.matches("/order"));
        assert!(!p.matches("/orders-x"));
    }

    #[test]
    fn literal_segments_match_in_any_letter_case() {
        let p = pattern("/payments/*");
        assert!(p.matches("/PAYMENTS/card"));
        assert!(p.matches("/Payments/card"));
        assert!(pattern("/Orders").matches("/orders"));
    }

    #[test]
    fn a_segment_matches_with_its_parameters_cut_off() {
        let p = pattern("/payments/*");
        assert!(p.matches("/payments;jsessionid=1/card"));
        assert!(p.matches("/payments/card;v=2"));
        assert!(!p.matches("/paymentsx;a/card"));
        assert!(pattern("/a;b").matches("/a;b"));
    }

    #[test]
    fn one_trailing_slash_is_optional_on_either_side() {
        assert!(pattern("/orders").matches("/orders/"));
        assert!(pattern("/orders/").matches("/orders"));
        assert!(pattern("/orders/").matches("/orders/"));
        let p = pattern("/payments/*");
        assert!(p.matches("/payments/card/"));
        // An empty last segment is still a segment to `*` (read without the trailing `/` it is
        // `/payments`, which is not this route; read with it, `*` matches the empty segment).
        assert!(p.matches("/payments/"));
        assert!(!p.matches("/payments"));
        assert!(pattern("/").matches("/"));
        assert!(!pattern("/").matches("/x"));
        assert!(!pattern("/orders").matches("/"));
        assert!(pattern("/**").matches("/"));
    }

    #[test]
    fn a_star_matches_exactly_one_segment() {
        let p = pattern("/orders/*");
        assert!(p.matches("/orders/1"));
        assert!(!p.matches("/orders"));
        assert!(!p.matches("/orders/1/items"));
        let mid = pattern("/orders/*/items");
        assert!(mid.matches("/orders/42/items"));
        assert!(!mid.matches("/orders/42/lines"));
    }

    #[test]
    fn a_trailing_double_star_matches_any_rest_including_none() {
        let p = pattern("/orders/**");
        assert!(p.matches("/orders"));
        assert!(p.matches("/orders/1"));
        assert!(p.matches("/orders/1/items/2"));
        assert!(!p.matches("/ordersx"));
        assert!(!p.matches("/other/1"));
        assert!(pattern("/**").matches("/anything/at/all"));
    }

    #[test]
    fn malformed_patterns_are_refused() {
        assert!(matches!(
            PathPattern::parse("orders"),
            Err(PatternError::NotAbsolute(_))
        ));
        assert!(matches!(
            PathPattern::parse("/a/**/b"),
            Err(PatternError::MisplacedRest(_))
        ));
        assert!(matches!(
            PathPattern::parse("/a/x*"),
            Err(PatternError::PartialWildcard(_))
        ));
    }

    #[test]
    fn the_first_rule_that_matches_method_and_path_wins() {
        let rules = [
            Matcher {
                methods: vec![Method::PATCH],
                path: pattern("/orders/*"),
            },
            Matcher {
                methods: vec![Method::POST],
                path: pattern("/orders/**"),
            },
            Matcher {
                methods: vec![Method::POST],
                path: pattern("/orders/*"),
            },
        ];
        assert_eq!(first_match(&rules, &Method::POST, "/orders/1"), Some(1));
        assert_eq!(first_match(&rules, &Method::PATCH, "/orders/1"), Some(0));
        assert_eq!(first_match(&rules, &Method::PUT, "/orders/1"), None);
    }
}
