//! The payments API: `POST /payments` (behind the idempotency layer) and `GET /payments/{id}`,
//! charging through a fake provider that dedups on a key derived from the request's.

pub mod handler;
pub mod model;
pub mod provider;

pub use handler::{PaymentsState, create_payment, get_payment};
pub use model::{CreatePayment, PaymentRecord};
pub use provider::{Charge, Gateway, GatewayConfig, GatewayError, provider_key};

/// Side-record namespace of payment records (key: payment id).
pub const PAYMENTS_NAMESPACE: &str = "payments";
