//! A [`Store`] that runs a hook before each write it passes on (`create`, `put`, `update`,
//! `delete`): the state tests count writes with it, and the durability simulation holds each
//! write as a disk's sync would.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use gateway_server::store::{BucketConfig, EngineError, Entry, Revision, Store, Watch};

/// What runs before each write; the write goes once its future is done.
pub type WriteHook = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// `inner` with `hook` before each write; reads and watches pass straight through.
pub struct HookedStore {
    pub inner: Arc<dyn Store>,
    pub hook: WriteHook,
}

impl HookedStore {
    fn write<T: Send + 'static>(
        &self,
        write: BoxFuture<'static, Result<T, EngineError>>,
    ) -> BoxFuture<'static, Result<T, EngineError>> {
        let before = (self.hook)();
        Box::pin(async move {
            before.await;
            write.await
        })
    }
}

impl Store for HookedStore {
    fn ensure_bucket(&self, config: BucketConfig) -> BoxFuture<'static, Result<(), EngineError>> {
        self.inner.ensure_bucket(config)
    }

    fn get(
        &self,
        bucket: &str,
        key: &str,
    ) -> BoxFuture<'static, Result<Option<Entry>, EngineError>> {
        self.inner.get(bucket, key)
    }

    fn create(
        &self,
        bucket: &str,
        key: &str,
        value: Bytes,
    ) -> BoxFuture<'static, Result<Revision, EngineError>> {
        self.write(self.inner.create(bucket, key, value))
    }

    fn put(
        &self,
        bucket: &str,
        key: &str,
        value: Bytes,
    ) -> BoxFuture<'static, Result<Revision, EngineError>> {
        self.write(self.inner.put(bucket, key, value))
    }

    fn update(
        &self,
        bucket: &str,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> BoxFuture<'static, Result<Revision, EngineError>> {
        self.write(self.inner.update(bucket, key, value, expected))
    }

    fn delete(
        &self,
        bucket: &str,
        key: &str,
        expected: Option<Revision>,
    ) -> BoxFuture<'static, Result<Revision, EngineError>> {
        self.write(self.inner.delete(bucket, key, expected))
    }

    fn watch(&self, bucket: &str, filter: &str) -> BoxFuture<'static, Result<Watch, EngineError>> {
        self.inner.watch(bucket, filter)
    }
}
