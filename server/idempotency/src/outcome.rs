//! What the layer did with each request, counted for `idempotency_requests_total{outcome=...}`.
//!
//! Every request that reaches the layer is counted under exactly one outcome.

use std::sync::atomic::{AtomicU64, Ordering};

/// The fate of one request at the idempotency layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// `executed`: a fresh (or expired) key; the handler ran and its response was stored.
    Executed,
    /// `taken_over`: the key's previous claim had run out of lease (its holder presumed dead); this
    /// request took it over, ran the handler and stored its response.
    TakenOver,
    /// `replayed`: the key was completed; the stored response was replayed.
    Replayed,
    /// `conflict`: the key is held by a request still running → 409.
    Conflict,
    /// `mismatch`: the key was used for a different request (fingerprint) → 422.
    Mismatch,
    /// `rejected_key`: missing or malformed `Idempotency-Key` → 400.
    RejectedKey,
    /// `rejected_body`: a JSON body that repeats a member name → 400, before anything is claimed.
    RejectedBody,
    /// `released`: the handler answered 5xx or panicked (or, under the default
    /// [`UnrecordedResponse::Retry`](crate::UnrecordedResponse::Retry), its response could not be
    /// stored or read), and the key was released for a retry.
    Released,
    /// `fenced`: while this request's handler ran, its claim was taken over; its completion was
    /// refused by the fencing token and its client got the winner's response or a 409.
    Fenced,
    /// `body_too_large`: request body over the limit → 413.
    BodyTooLarge,
    /// `body_unreadable`: the request body could not be read (the client went away) → 400.
    BodyUnreadable,
    /// `unauthenticated`: the request reached the layer without a scope → 401.
    Unauthenticated,
    /// `store_error`: the store failed (poisoned, full disk, closed) → 503.
    StoreError,
    /// `quota_exceeded`: a new key from a scope that already holds its limit of live keys →
    /// 429; nothing was claimed.
    QuotaExceeded,
    /// `effect_unknown`: the inner service said its effect is unknown
    /// ([`ClaimDirective::EffectUnknown`](crate::ClaimDirective)); the key was neither completed
    /// nor released and stays in progress until its lease runs out.
    EffectUnknown,
    /// `no_key`: no `Idempotency-Key` on a layer whose key is optional; passed through untouched.
    NoKey,
    /// `unrecorded`: the handler ran but its response could not be recorded (the store failed or
    /// refused it, or its body failed while read), and under
    /// [`UnrecordedResponse::SendAndHold`](crate::UnrecordedResponse::SendAndHold) its client got
    /// the handler's own response (a 500 if the body could not be read); the key was neither
    /// completed nor released and stays in progress until its lease runs out.
    Unrecorded,
}

impl Outcome {
    /// Every outcome, in the order metrics list them.
    pub const ALL: [Outcome; 17] = [
        Outcome::Executed,
        Outcome::TakenOver,
        Outcome::Replayed,
        Outcome::Conflict,
        Outcome::Mismatch,
        Outcome::RejectedKey,
        Outcome::RejectedBody,
        Outcome::Released,
        Outcome::Fenced,
        Outcome::BodyTooLarge,
        Outcome::BodyUnreadable,
        Outcome::Unauthenticated,
        Outcome::StoreError,
        Outcome::QuotaExceeded,
        Outcome::EffectUnknown,
        Outcome::NoKey,
        Outcome::Unrecorded,
    ];

    /// The metric label value.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Executed => "executed",
            Outcome::TakenOver => "taken_over",
            Outcome::Replayed => "replayed",
            Outcome::Conflict => "conflict",
            Outcome::Mismatch => "mismatch",
            Outcome::RejectedKey => "rejected_key",
            Outcome::RejectedBody => "rejected_body",
            Outcome::Released => "released",
            Outcome::Fenced => "fenced",
            Outcome::BodyTooLarge => "body_too_large",
            Outcome::BodyUnreadable => "body_unreadable",
            Outcome::Unauthenticated => "unauthenticated",
            Outcome::StoreError => "store_error",
            Outcome::QuotaExceeded => "quota_exceeded",
            Outcome::EffectUnknown => "effect_unknown",
            Outcome::NoKey => "no_key",
            Outcome::Unrecorded => "unrecorded",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Counters per outcome. Shared by every clone of a layer.
#[derive(Debug, Default)]
pub struct OutcomeCounts {
    counts: [AtomicU64; Outcome::ALL.len()],
}

impl OutcomeCounts {
    /// Counts one request.
    pub fn record(&self, outcome: Outcome) {
        self.counts[outcome.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests counted under `outcome`.
    pub fn get(&self, outcome: Outcome) -> u64 {
        self.counts[outcome.index()].load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_outcome_at_its_index() {
        for (i, outcome) in Outcome::ALL.iter().enumerate() {
            assert_eq!(outcome.index(), i, "{outcome:?}");
        }
    }
}
