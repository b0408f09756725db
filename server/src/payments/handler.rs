//! HTTP handlers for payments.
//!
//! `create_payment` validates the body (a 4xx problem, and no charge, when it is malformed or
//! invalid), charges through the [`Gateway`] with a provider key derived unambiguously from the
//! account and our key ([`provider_key`]), and
//! answers 201 with the payment. The payment record does not get written here: it is returned as a
//! [`SideRecords`] extension so the idempotency layer writes it in the same atomic append as the
//! key's completion (or, with the layer off, `persist_side_records` writes it).

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Extension, FromRequestParts, Path, State};
use axum::http::header::{CONTENT_TYPE, LOCATION};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tracing::{error, info};

use super::PAYMENTS_NAMESPACE;
use super::model::{CreatePayment, PaymentRecord};
use super::provider::{Gateway, GatewayError, provider_key};
use crate::auth::Account;
use idemlog_idempotency::problem::Problem;
use idemlog_idempotency::{ClaimInfo, IdempotencyKey, RecordWrite, SideRecords, StoreHandle, key};

/// What the payment handlers need.
#[derive(Clone)]
pub struct PaymentsState {
    /// The store (payment records are business records in it).
    pub store: StoreHandle,
    /// The fake provider.
    pub gateway: Gateway,
}

fn invalid(status: StatusCode, detail: impl Into<String>) -> Response {
    let detail = detail.into();
    // The one INFO line of a request the handler turns down (a created payment has its own): at
    // the default level an operator sees why, and the request span names the account and key. The
    // reason in its quoted, escaped form: it can echo the client's text (a JSON error naming an
    // unknown member), and a raw line break there would forge a log line.
    info!(status = status.as_u16(), reason = ?detail, "payment rejected");
    let (slug, title) = match status {
        StatusCode::BAD_REQUEST => ("malformed-body", "Malformed request body"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ("unsupported-media-type", "Body must be JSON"),
        StatusCode::PAYLOAD_TOO_LARGE => ("body-too-large", "Request body too large"),
        _ => ("invalid-payment", "Invalid payment request"),
    };
    Problem::new(status, slug, title, detail).into_response()
}

/// Where a payment is read back (`Location` of a created one): this prefix and its id.
const PAYMENTS_PATH: &str = "/payments/";

fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    let mut response = (status, body).into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The request's `Idempotency-Key`: the one the idempotency layer parsed, or without the layer
/// (benchmark mode) the header's if it is valid. Read in place: axum's `HeaderMap` extractor
/// would clone every header of every request for this rare fallback.
pub struct RequestKey(Option<IdempotencyKey>);

impl<S: Sync> FromRequestParts<S> for RequestKey {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(Self(match parts.extensions.get::<IdempotencyKey>() {
            Some(key) => Some(key.clone()),
            None => key::from_headers(&parts.headers).ok(),
        }))
    }
}

/// `POST /payments`.
pub async fn create_payment(
    State(state): State<PaymentsState>,
    Extension(account): Extension<Account>,
    RequestKey(key): RequestKey,
    claim: Option<Extension<ClaimInfo>>,
    body: Result<Json<CreatePayment>, JsonRejection>,
) -> Response {
    let request = match body {
        Ok(Json(request)) => request,
        Err(rejection) => return invalid(rejection.status(), rejection.body_text()),
    };
    let payment = match request.validate() {
        Ok(payment) => payment,
        Err(detail) => return invalid(StatusCode::UNPROCESSABLE_ENTITY, detail),
    };

    // The provider key is derived from ours, so a re-run of this request (after a lost response, a
    // 5xx or a takeover) gets the original charge back. Without the layer (benchmark mode) the
    // header is still honoured if valid; a request without one is a one-off charge.
    let provider_key = match &key {
        Some(key) => provider_key(account.as_str(), key.as_str()),
        None => provider_key(account.as_str(), &state.gateway.new_id("once_")),
    };
    let expires_at_ms = claim.and_then(|Extension(c)| c.expires_at_ms);

    let charge = match state
        .gateway
        .charge(
            provider_key,
            payment.amount_minor,
            payment.currency.clone(),
            expires_at_ms,
        )
        .await
    {
        Ok(charge) => charge,
        Err(e @ GatewayError::ResponseLost { .. }) => {
            info!(error = %e, "payment provider call failed: 502");
            return Problem::new(
                StatusCode::BAD_GATEWAY,
                "provider-unavailable",
                "Payment provider error",
                "the payment provider did not answer; retry with the same Idempotency-Key",
            )
            .into_response();
        }
        Err(GatewayError::KeyReused { charge_id }) => {
            info!(%charge_id, "payment rejected: the provider holds this key's charge with other parameters: 409");
            return Problem::new(
                StatusCode::CONFLICT,
                "provider-key-reused",
                "Payment provider refused the request",
                format!("the provider already holds charge {charge_id} for this key with other parameters"),
            )
            .into_response();
        }
        Err(e) => {
            error!(error = %e, "payment provider storage failed: 503");
            return Problem::store_unavailable(
                "the payment could not be made now; retry with the same Idempotency-Key",
            )
            .into_response();
        }
    };

    let record = PaymentRecord {
        id: state.gateway.new_id("pay_"),
        account: account.as_str().to_owned(),
        amount_minor: payment.amount_minor,
        currency: payment.currency,
        status: "succeeded".to_owned(),
        charge_id: charge.id,
    };
    let (stored, public) = match (serde_json::to_vec(&record), record.to_public_json()) {
        (Ok(stored), Ok(public)) => (stored, public),
        (Err(e), _) | (_, Err(e)) => {
            error!(error = %e, "payment could not be serialised");
            return Problem::internal("the payment could not be recorded").into_response();
        }
    };
    let mut response = json_response(StatusCode::CREATED, public);
    if let Ok(location) = HeaderValue::try_from([PAYMENTS_PATH, record.id.as_str()].concat()) {
        response.headers_mut().insert(LOCATION, location);
    }
    response
        .extensions_mut()
        .insert(SideRecords(vec![RecordWrite::put(
            PAYMENTS_NAMESPACE,
            record.id.clone(),
            stored,
        )]));
    info!(payment_id = %record.id, charge_id = %record.charge_id, "payment created");
    response
}

fn not_found(id: &str) -> Response {
    Problem::new(
        StatusCode::NOT_FOUND,
        "payment-not-found",
        "Payment not found",
        format!("no payment {id:?} for this account"),
    )
    .into_response()
}

/// `GET /payments/{id}`: the payment for its owner, 404 for every other account.
pub async fn get_payment(
    State(state): State<PaymentsState>,
    Extension(account): Extension<Account>,
    Path(id): Path<String>,
) -> Response {
    if id.is_empty() || id.len() > 255 {
        return not_found(&id);
    }
    let bytes = match state.store.record(PAYMENTS_NAMESPACE, &id).await {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return not_found(&id),
        Err(e) => {
            error!(error = %e, "payment lookup failed: 503");
            return Problem::store_unavailable("the payment could not be read now; retry later")
                .into_response();
        }
    };
    let record: PaymentRecord = match serde_json::from_slice(&bytes) {
        Ok(record) => record,
        Err(e) => {
            // The id comes from the URL, percent-decoded: quoted and escaped like any client text.
            error!(error = %e, payment_id = ?id, "stored payment is unreadable");
            return Problem::internal("the payment could not be read").into_response();
        }
    };
    if record.account != account.as_str() {
        // Same answer as for a payment that does not exist: ids of other accounts are not revealed.
        return not_found(&id);
    }
    match record.to_public_json() {
        Ok(body) => json_response(StatusCode::OK, body),
        Err(e) => {
            error!(error = %e, "payment could not be serialised");
            Problem::internal("the payment could not be read").into_response()
        }
    }
}
