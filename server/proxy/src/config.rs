//! The settings each protected request runs under: the command line's defaults, and the per-route
//! rules of the TOML file (`--config`).
//!
//! ```toml
//! [[route]]
//! methods = ["POST"]              # default ["POST", "PATCH"]
//! path = "/orders/*"              # see `routes` for the pattern grammar
//! key = "required"                # "required" (400 without a key) or "optional" (the default)
//! key_ttl = "24h"
//! max_body_bytes = 1048576
//! max_stored_response_bytes = 1048576
//! stored_headers = ["content-type", "location", "etag"]
//! release_statuses = ["5xx", 408, 429]  # the default; classes ("4xx", "5xx") or codes (503)
//! ```
//!
//! Every field but `path` is optional and falls back to the command line's value. Unknown fields
//! are refused, so a typo is an error at start-up rather than a silently ignored setting. A rule's
//! `lease` must equal `--lease`: the lease is a property of the store, shared by every route.

use std::path::Path;
use std::time::Duration;

use axum::http::{HeaderName, Method};
use serde::Deserialize;

use crate::cli::{Cli, parse_positive_duration};
use crate::routes::{Matcher, PathPattern};

/// Whether a protected route needs an `Idempotency-Key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyRequirement {
    /// Without a key: 400 problem+json.
    Required,
    /// Without a key: passed through untouched, with no idempotency.
    Optional,
}

/// One entry of `release_statuses`: a class (`"5xx"`) or a code (`503`, `"503"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusSpec {
    /// Every status of a class: 4 for `4xx`, 5 for `5xx`.
    Class(u8),
    /// One status.
    Code(u16),
}

impl StatusSpec {
    /// Parses `4xx`, `5xx` or a code from 100 to 599.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim().to_ascii_lowercase();
        if let Some(class) = t.strip_suffix("xx") {
            return match class.parse::<u8>() {
                Ok(c @ 1..=5) => Ok(Self::Class(c)),
                _ => Err(format!("status class {text:?}: write 4xx or 5xx")),
            };
        }
        match t.parse::<u16>() {
            Ok(code @ 100..=599) => Ok(Self::Code(code)),
            _ => Err(format!(
                "status {text:?}: write a class (4xx, 5xx) or a code from 100 to 599"
            )),
        }
    }

    /// True if `status` is in this class or is this code.
    pub fn contains(self, status: u16) -> bool {
        match self {
            Self::Class(c) => status / 100 == u16::from(c),
            Self::Code(code) => status == code,
        }
    }
}

/// The settings of one protected route.
#[derive(Debug, Clone)]
pub struct RouteSettings {
    /// Key required or optional.
    pub key: KeyRequirement,
    /// How long a key is remembered.
    pub key_ttl: Duration,
    /// The store's lease (the same for every route).
    pub lease: Duration,
    /// Largest request body; larger → 413.
    pub max_body_bytes: usize,
    /// Largest response body stored for replay.
    pub max_stored_response_bytes: usize,
    /// Response headers stored and replayed (lower case).
    pub stored_headers: Vec<HeaderName>,
    /// Upstream statuses that release the key.
    pub release_statuses: Vec<StatusSpec>,
}

/// A rule: which requests, and their settings.
#[derive(Debug, Clone)]
pub struct RouteRule {
    /// Methods and path.
    pub matcher: Matcher,
    /// Settings.
    pub settings: RouteSettings,
}

/// The default methods protected, with or without a rule.
pub const DEFAULT_METHODS: [Method; 2] = [Method::POST, Method::PATCH];

/// The default stored headers.
pub const DEFAULT_STORED_HEADERS: [&str; 3] = ["content-type", "location", "etag"];

/// Why the configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("could not read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message (line and column included).
        message: String,
    },
    /// A rule's value is invalid.
    #[error("{path}: route {index} ({pattern}): {message}")]
    Rule {
        /// The file.
        path: String,
        /// 1-based rule number.
        index: usize,
        /// Its path pattern as written.
        pattern: String,
        /// What is wrong.
        message: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToml {
    #[serde(default)]
    route: Vec<RouteToml>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteToml {
    path: String,
    methods: Option<Vec<String>>,
    key: Option<KeyRequirement>,
    key_ttl: Option<String>,
    lease: Option<String>,
    max_body_bytes: Option<usize>,
    max_stored_response_bytes: Option<usize>,
    stored_headers: Option<Vec<String>>,
    release_statuses: Option<Vec<StatusToml>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum StatusToml {
    Code(u16),
    Text(String),
}

impl RouteSettings {
    /// The command line's defaults (key optional).
    pub fn defaults(cli: &Cli) -> Self {
        Self {
            key: KeyRequirement::Optional,
            key_ttl: cli.key_ttl,
            lease: cli.lease,
            max_body_bytes: cli.max_body_bytes,
            max_stored_response_bytes: cli.max_stored_response_bytes,
            stored_headers: DEFAULT_STORED_HEADERS
                .iter()
                .map(|h| HeaderName::from_static(h))
                .collect(),
            release_statuses: DEFAULT_RELEASE_STATUSES.to_vec(),
        }
    }
}

/// What releases a key unless a rule says otherwise: every 5xx, and the two 4xx answers that say
/// the upstream did not act on the request, so that a retry must be able to run it: 408 (the
/// upstream gave up reading the request) and 429 (RFC 6585: rate limited, not processed). Stored,
/// either would be replayed to every retry for the key's whole TTL.
pub const DEFAULT_RELEASE_STATUSES: [StatusSpec; 3] = [
    StatusSpec::Class(5),
    StatusSpec::Code(408),
    StatusSpec::Code(429),
];

/// Reads the rules of `path`, each filled in from `defaults`.
pub fn load_rules(path: &Path, defaults: &RouteSettings) -> Result<Vec<RouteRule>, ConfigError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: shown.clone(),
        source,
    })?;
    parse_rules(&text, &shown, defaults)
}

/// Parses the TOML text of a rules file (`shown` names it in errors).
pub fn parse_rules(
    text: &str,
    shown: &str,
    defaults: &RouteSettings,
) -> Result<Vec<RouteRule>, ConfigError> {
    let file: FileToml = toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: shown.to_owned(),
        message: e.to_string(),
    })?;
    file.route
        .into_iter()
        .enumerate()
        .map(|(i, rule)| {
            let pattern = rule.path.clone();
            compile_rule(rule, defaults).map_err(|message| ConfigError::Rule {
                path: shown.to_owned(),
                index: i + 1,
                pattern,
                message,
            })
        })
        .collect()
}

fn compile_rule(rule: RouteToml, defaults: &RouteSettings) -> Result<RouteRule, String> {
    let path = PathPattern::parse(&rule.path).map_err(|e| e.to_string())?;
    let methods = match rule.methods {
        None => DEFAULT_METHODS.to_vec(),
        Some(methods) => {
            if methods.is_empty() {
                return Err("methods is empty: list at least one method".to_owned());
            }
            methods
                .iter()
                .map(|m| {
                    Method::from_bytes(m.trim().to_ascii_uppercase().as_bytes())
                        .map_err(|_| format!("method {m:?} is not a valid HTTP method"))
                })
                .collect::<Result<_, _>>()?
        }
    };
    let mut settings = defaults.clone();
    if let Some(key) = rule.key {
        settings.key = key;
    }
    if let Some(ttl) = rule.key_ttl {
        settings.key_ttl = parse_positive_duration(&ttl)?;
    }
    if let Some(lease) = rule.lease {
        let lease = parse_positive_duration(&lease)?;
        if lease != defaults.lease {
            return Err(format!(
                "lease {} differs from --lease {}: the lease belongs to the store and is the \
                 same for every route; set --lease instead",
                humantime::format_duration(lease),
                humantime::format_duration(defaults.lease)
            ));
        }
    }
    if let Some(bytes) = rule.max_body_bytes {
        settings.max_body_bytes = bytes;
    }
    if let Some(bytes) = rule.max_stored_response_bytes {
        settings.max_stored_response_bytes = bytes;
    }
    if let Some(headers) = rule.stored_headers {
        settings.stored_headers = headers
            .iter()
            .map(|h| {
                HeaderName::from_bytes(h.trim().to_ascii_lowercase().as_bytes())
                    .map_err(|_| format!("stored header {h:?} is not a valid header name"))
            })
            .collect::<Result<_, _>>()?;
    }
    if let Some(statuses) = rule.release_statuses {
        settings.release_statuses = statuses
            .iter()
            .map(|s| match s {
                StatusToml::Code(code) => StatusSpec::parse(&code.to_string()),
                StatusToml::Text(text) => StatusSpec::parse(text),
            })
            .collect::<Result<_, _>>()?;
    }
    Ok(RouteRule {
        matcher: Matcher { methods, path },
        settings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> RouteSettings {
        RouteSettings {
            key: KeyRequirement::Optional,
            key_ttl: Duration::from_secs(86_400),
            lease: Duration::from_secs(30),
            max_body_bytes: 1 << 20,
            max_stored_response_bytes: 1 << 20,
            stored_headers: DEFAULT_STORED_HEADERS
                .iter()
                .map(|h| HeaderName::from_static(h))
                .collect(),
            release_statuses: DEFAULT_RELEASE_STATUSES.to_vec(),
        }
    }

    #[test]
    fn a_rule_overrides_only_the_fields_it_names() {
        let rules = parse_rules(
            r#"
            [[route]]
            methods = ["post"]
            path = "/orders/*"
            key = "required"
            key_ttl = "1h"
            stored_headers = ["Content-Type", "Set-Cookie"]
            release_statuses = ["5xx", 409, "429"]
            "#,
            "t.toml",
            &defaults(),
        )
        .expect("valid");
        assert_eq!(rules.len(), 1);
        let rule = &rules[0];
        assert_eq!(rule.matcher.methods, vec![Method::POST]);
        assert_eq!(rule.settings.key, KeyRequirement::Required);
        assert_eq!(rule.settings.key_ttl, Duration::from_secs(3600));
        assert_eq!(rule.settings.max_body_bytes, 1 << 20);
        assert_eq!(
            rule.settings.stored_headers,
            vec![
                HeaderName::from_static("content-type"),
                HeaderName::from_static("set-cookie")
            ]
        );
        assert_eq!(
            rule.settings.release_statuses,
            vec![
                StatusSpec::Class(5),
                StatusSpec::Code(409),
                StatusSpec::Code(429)
            ]
        );
    }

    #[test]
    fn a_rule_without_methods_protects_post_and_patch() {
        let rules = parse_rules("[[route]]\npath = \"/a\"\n", "t.toml", &defaults()).expect("ok");
        assert_eq!(rules[0].matcher.methods, DEFAULT_METHODS.to_vec());
    }

    #[test]
    fn unknown_fields_and_bad_values_are_errors_naming_the_rule() {
        let typo = parse_rules(
            "[[route]]\npath = \"/a\"\nkey_tll = \"1h\"\n",
            "t.toml",
            &defaults(),
        );
        assert!(matches!(typo, Err(ConfigError::Parse { .. })), "{typo:?}");
        let bad = parse_rules(
            "[[route]]\npath = \"/a\"\nrelease_statuses = [\"6xx\"]\n",
            "t.toml",
            &defaults(),
        );
        let Err(ConfigError::Rule { index, message, .. }) = bad else {
            panic!("expected a rule error, got {bad:?}");
        };
        assert_eq!(index, 1);
        assert!(message.contains("6xx"), "{message}");
        let lease = parse_rules(
            "[[route]]\npath = \"/a\"\nlease = \"5s\"\n",
            "t.toml",
            &defaults(),
        );
        assert!(matches!(lease, Err(ConfigError::Rule { .. })), "{lease:?}");
    }

    #[test]
    fn status_specs_match_their_class_or_code() {
        assert!(StatusSpec::parse("5xx").expect("ok").contains(503));
        assert!(!StatusSpec::parse("5xx").expect("ok").contains(499));
        assert!(StatusSpec::parse("409").expect("ok").contains(409));
        assert!(StatusSpec::parse("xx").is_err());
        assert!(StatusSpec::parse("600").is_err());
    }
}
