//! The append-only log: frames (`frame`), the operations inside them (`op`), segment files
//! (`segment`, `segments`), the group-committing writer (`writer`), its background flusher and
//! when that flusher syncs for waiting tasks (`group_commit`).
//! `FORMAT.md` at the crate root documents the bytes.

pub(crate) mod flusher;
pub(crate) mod frame;
pub(crate) mod group_commit;
pub(crate) mod op;
pub(crate) mod segment;
pub(crate) mod segments;
pub(crate) mod wakeup;
pub(crate) mod writer;
