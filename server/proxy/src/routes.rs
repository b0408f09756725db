//! Route rules: which requests are protected, and with which settings.
//!
//! A rule matches a request by method and path pattern. Patterns are written segment by segment:
//! a literal segment matches itself exactly, `*` matches any one segment (an empty one too, as in
//! `/orders//x`), and a final `**` matches any rest of the path, including none (`/orders/**`
//! matches `/orders`, `/orders/1` and `/orders/1/items`). The query string is not part of the
//! match. The first rule that matches wins; see [`crate::config`] for what applies when none does.

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
        let parts: Vec<&str> = body.split('/').collect();
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

    /// True if `path` (without its query) matches.
    pub fn matches(&self, path: &str) -> bool {
        let Some(body) = path.strip_prefix('/') else {
            return false;
        };
        let mut parts = body.split('/');
        for segment in &self.segments {
            let Some(part) = parts.next() else {
                return false;
            };
            match segment {
                Segment::Any => {}
                Segment::Literal(literal) if literal == part => {}
                Segment::Literal(_) => return false,
            }
        }
        if self.rest {
            return true;
        }
        parts.next().is_none()
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
        assert!(!p.matches("/orders/"));
        assert!(!p.matches("/order"));
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
