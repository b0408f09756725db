//! How a statement reaches the server: named and cached per connection when we talk to PostgreSQL
//! directly, unnamed when a pooler in transaction mode sits between us and the server.
//!
//! A named prepared statement lives in one server session. PgBouncer in `pool_mode = transaction`
//! (1.18, and later versions without `max_prepared_statements`) hands each transaction, and each
//! statement outside a transaction, to whichever server connection is free: a statement prepared
//! on one server connection and executed on another fails ("prepared statement \"s3\" does not
//! exist"), and a leftover name can collide with another client's. So under [`Pooling::Transaction`]
//! every statement is sent unnamed, with its parameter types, as Parse/Bind/Execute/Sync in one
//! flight (tokio-postgres' `query_typed`): still one round trip, and nothing outlives the
//! transaction. The price is a parse and plan per call on the server; direct connections
//! ([`Pooling::None`]) keep the cached named statements.
//!
//! Every statement declares its parameter types ([`Sql::types`]) and is sent with them in both
//! modes, so a type mistake fails the same way whichever mode a test runs in. Statements that
//! return a count of changed rows do it with `RETURNING`, because an unnamed statement reports
//! rows, not a command tag.

use std::future::Future;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Error, Row, Statement};

use super::error::Fail;
use crate::store::StoreError;

/// Whether a connection pooler in transaction mode sits between the backend and PostgreSQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooling {
    /// Direct connections (or a pooler in session mode): statements are prepared once per
    /// connection and cached, and session settings travel in the start-up packet.
    #[default]
    None,
    /// A pooler in transaction mode (PgBouncer `pool_mode = transaction`): unnamed statements
    /// only, and no start-up `options` (PgBouncer refuses that parameter). Set the server-side
    /// timeouts on the role instead (README, "Through PgBouncer").
    Transaction,
}

/// One statement's text and the types of its parameters `$1..$n`, in order.
pub(crate) struct Sql {
    pub text: String,
    pub types: &'static [Type],
}

impl Sql {
    pub(crate) fn new(text: String, types: &'static [Type]) -> Self {
        Self { text, types }
    }

    /// Runs the statement on `session` with `params` (as many as [`Sql::types`]) and returns
    /// its rows.
    pub(crate) async fn query<S: Session>(
        &self,
        session: &S,
        pooling: Pooling,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        assert_eq!(
            params.len(),
            self.types.len(),
            "statement parameters and declared types differ: {}",
            self.text
        );
        match pooling {
            Pooling::None => {
                let statement = session.prepare_cached(&self.text, self.types).await?;
                session.query_prepared(&statement, params).await
            }
            Pooling::Transaction => {
                let typed: Vec<(&(dyn ToSql + Sync), Type)> = params
                    .iter()
                    .zip(self.types)
                    .map(|(p, t)| (*p, t.clone()))
                    .collect();
                session.query_unnamed(&self.text, &typed).await
            }
        }
    }

    /// Like [`Sql::query`], for statements that return exactly one row (an aggregate or a
    /// constant `SELECT`); any other count is reported as an internal error naming the statement.
    pub(crate) async fn query_one<S: Session>(
        &self,
        session: &S,
        pooling: Pooling,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, Fail> {
        let mut rows = self.query(session, pooling, params).await?;
        if rows.len() != 1 {
            return Err(Fail::Store(StoreError::Internal(format!(
                "a statement that returns one row returned {}: {}",
                rows.len(),
                first_line(&self.text)
            ))));
        }
        Ok(rows.swap_remove(0))
    }

    /// Like [`Sql::query`], for statements that return at most one row.
    pub(crate) async fn query_opt<S: Session>(
        &self,
        session: &S,
        pooling: Pooling,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, Error> {
        Ok(self
            .query(session, pooling, params)
            .await?
            .into_iter()
            .next())
    }
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default().trim()
}

/// A connection or a transaction on one: what [`Sql`] needs to run on it.
pub(crate) trait Session: Sync {
    fn prepare_cached(
        &self,
        text: &str,
        types: &[Type],
    ) -> impl Future<Output = Result<Statement, Error>> + Send;
    fn query_prepared(
        &self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send;
    fn query_unnamed(
        &self,
        text: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send;
}

impl Session for deadpool_postgres::Object {
    async fn prepare_cached(&self, text: &str, types: &[Type]) -> Result<Statement, Error> {
        deadpool_postgres::ClientWrapper::prepare_typed_cached(self, text, types).await
    }
    async fn query_prepared(
        &self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        tokio_postgres::Client::query(self, statement, params).await
    }
    async fn query_unnamed(
        &self,
        text: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, Error> {
        tokio_postgres::Client::query_typed(self, text, params).await
    }
}

impl Session for deadpool_postgres::Transaction<'_> {
    async fn prepare_cached(&self, text: &str, types: &[Type]) -> Result<Statement, Error> {
        deadpool_postgres::Transaction::prepare_typed_cached(self, text, types).await
    }
    async fn query_prepared(
        &self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        tokio_postgres::Transaction::query(self, statement, params).await
    }
    async fn query_unnamed(
        &self,
        text: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, Error> {
        tokio_postgres::Transaction::query_typed(self, text, params).await
    }
}
