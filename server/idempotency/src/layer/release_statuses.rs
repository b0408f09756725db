//! Which response statuses release the key instead of completing it.
//!
//! A released key may be retried and run again; a completed one is replayed. The default releases
//! every 5xx (the handler failed, a retry should run it again) and completes everything else (a
//! 4xx is an answer: replaying it is what the client must see).

use axum::http::StatusCode;

/// A set of statuses: whole classes (`5xx`) and single codes (`409`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseStatuses {
    /// `classes[c]`: every status `c00..=c99` is in the set (index 1 to 5).
    classes: [bool; 6],
    codes: Vec<u16>,
}

impl Default for ReleaseStatuses {
    /// Every 5xx.
    fn default() -> Self {
        Self::none().with_class(5)
    }
}

impl ReleaseStatuses {
    /// The empty set: no status releases the key (a panic or a [`ClaimDirective`](crate::ClaimDirective) still can).
    pub fn none() -> Self {
        Self {
            classes: [false; 6],
            codes: Vec::new(),
        }
    }

    /// Adds a class: 4 for every 4xx, 5 for every 5xx (1 to 5; others are ignored).
    pub fn with_class(mut self, class: u8) -> Self {
        if let Some(slot) = self.classes.get_mut(usize::from(class)) {
            *slot = true;
        }
        self
    }

    /// Adds one status code.
    pub fn with_code(mut self, code: u16) -> Self {
        if !self.codes.contains(&code) {
            self.codes.push(code);
        }
        self
    }

    /// True if `status` releases the key.
    pub fn contains(&self, status: StatusCode) -> bool {
        let code = status.as_u16();
        self.classes
            .get(usize::from(code / 100))
            .copied()
            .unwrap_or(false)
            || self.codes.contains(&code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_releases_every_5xx_and_nothing_else() {
        let set = ReleaseStatuses::default();
        assert!(set.contains(StatusCode::INTERNAL_SERVER_ERROR));
        assert!(set.contains(StatusCode::from_u16(599).expect("status")));
        assert!(!set.contains(StatusCode::CONFLICT));
        assert!(!set.contains(StatusCode::CREATED));
    }

    #[test]
    fn classes_and_codes_combine() {
        let set = ReleaseStatuses::none().with_code(503).with_code(429);
        assert!(set.contains(StatusCode::SERVICE_UNAVAILABLE));
        assert!(set.contains(StatusCode::TOO_MANY_REQUESTS));
        assert!(!set.contains(StatusCode::INTERNAL_SERVER_ERROR));
        let set = set.with_class(4);
        assert!(set.contains(StatusCode::NOT_FOUND));
        assert!(!ReleaseStatuses::none().contains(StatusCode::BAD_GATEWAY));
    }
}
