//! How a handler hands business records to the layer.
//!
//! A handler that must write records together with its response (the order it created) returns them
//! as a [`SideRecords`] response extension. The idempotency layer removes the extension and passes
//! the writes to `IdempotencyStore::complete`, which appends the completion and the records in one
//! atomic frame: the records exist if and only if the key is completed. When the handler answers
//! 5xx the key is released and the records are dropped: a handler must not depend on them then.
//!
//! Routes served without the layer still need their records written: [`persist_side_records`]
//! does that with `IdempotencyStore::write_records`, outside any idempotency record.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::error;

use crate::problem::Problem;
use crate::store::{RecordWrite, StoreHandle};

/// Records to write atomically with the response's completion. Put in the response extensions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SideRecords(pub Vec<RecordWrite>);

/// Middleware for routes without the idempotency layer: writes a response's [`SideRecords`] before
/// the response goes out (a failed write turns it into a 503).
pub async fn persist_side_records(
    State(store): State<StoreHandle>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = next.run(request).await;
    let Some(SideRecords(writes)) = response.extensions_mut().remove::<SideRecords>() else {
        return response;
    };
    if response.status().is_server_error() || writes.is_empty() {
        return response;
    }
    match store.write_records(&writes).await {
        Ok(()) => response,
        Err(e) => {
            error!(error = %e, "writing side records failed");
            Problem::store_unavailable("the records could not be written now; retry later")
                .into_response()
        }
    }
}
