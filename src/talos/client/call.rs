//! How every call is made: its context and deadline, the generated stubs, the one-shot and
//! retried forms, and the checks every reply goes through (`metadata.error` in an OK reply,
//! exactly one entry for a single-node call, a decodable spec).

use std::future::Future;
use std::time::Duration;

use prost::Message;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use super::*;
use crate::talos::MAX_MESSAGE_SIZE;
use crate::talos::api::common;
use crate::talos::api::cosi::resource as cosi;
use crate::talos::api::machine::{self, machine_service_client};
use crate::talos::api::storage::{self, storage_service_client};
use crate::talos::error::{CallContext, Rpc, TalosError, classify, classify_code};
use crate::talos::retry::retry_idempotent;

impl TalosClient {
    pub(super) fn ctx(&self, rpc: Rpc, deadline: Duration) -> CallContext {
        CallContext {
            target: self.target(),
            rpc,
            maintenance: self.security == Security::Maintenance,
            deadline,
        }
    }

    pub(super) fn request<T>(&self, msg: T, deadline: Duration) -> Request<T> {
        let mut req = Request::new(msg);
        req.set_timeout(deadline);
        if let Some((_, value)) = &self.node {
            req.metadata_mut().insert(NODE_HEADER, value.clone());
        }
        req
    }

    pub(super) fn machine(&self) -> machine_service_client::MachineServiceClient<Channel> {
        machine_service_client::MachineServiceClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE)
    }

    pub(super) fn storage(&self) -> storage_service_client::StorageServiceClient<Channel> {
        storage_service_client::StorageServiceClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
    }

    pub(super) fn cosi(&self) -> cosi::state_client::StateClient<Channel> {
        cosi::state_client::StateClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
    }

    /// Runs one unary call under the deadline and maps its failure.
    pub(super) async fn once<T, Fut>(
        &self,
        rpc: Rpc,
        deadline: Duration,
        fut: Fut,
    ) -> Result<T, TalosError>
    where
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let ctx = self.ctx(rpc, deadline);
        match tokio::time::timeout(deadline, fut).await {
            Err(_) => Err(TalosError::Timeout {
                target: ctx.target,
                rpc,
                after: deadline,
            }),
            Ok(Err(status)) => {
                let err = classify(&status, &ctx);
                tracing::debug!(rpc = rpc.path(), target = %ctx.target, code = ?status.code(), error = %err, "talos call failed");
                Err(err)
            }
            Ok(Ok(resp)) => Ok(resp.into_inner()),
        }
    }

    /// Runs an idempotent call with the retry policy.
    pub(super) async fn idempotent<T, F, Fut>(&self, rpc: Rpc, op: F) -> Result<T, TalosError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, TalosError>>,
    {
        debug_assert!(rpc.idempotent());
        retry_idempotent(self.retry, rpc.path(), op).await
    }

    /// One unary call whose reply lists per-node entries: sent with the call deadline and the
    /// `node` header, its failure classified, every entry checked for `metadata.error`, and
    /// exactly one entry expected. Idempotent RPCs are retried with the retry policy; the
    /// others are made exactly once. `call` makes the call on a clone of `client`.
    pub(super) async fn unary<C, Req, Resp, F, Fut>(
        &self,
        rpc: Rpc,
        client: C,
        req: Req,
        call: F,
    ) -> Result<Resp::Entry, TalosError>
    where
        C: Clone,
        Req: Clone,
        Resp: Reply,
        F: Fn(C, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        if rpc.idempotent() {
            self.idempotent(rpc, || {
                self.unary_attempt(rpc, client.clone(), req.clone(), &call)
            })
            .await
        } else {
            self.unary_attempt(rpc, client, req, &call).await
        }
    }

    pub(super) async fn unary_attempt<C, Req, Resp, F, Fut>(
        &self,
        rpc: Rpc,
        client: C,
        req: Req,
        call: &F,
    ) -> Result<Resp::Entry, TalosError>
    where
        Resp: Reply,
        F: Fn(C, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let d = self.deadlines.call;
        let resp = self
            .once(rpc, d, call(client, self.request(req, d)))
            .await?;
        resp.into_entry(&self.ctx(rpc, d))
    }

    /// Opens a server stream and reads it to its end, all under one deadline `d`, retried
    /// with the retry policy (every streamed RPC here is a read). `drain` reads the stream.
    pub(super) async fn streamed<C, Req, Item, Out, F, Fut, D, DFut>(
        &self,
        rpc: Rpc,
        d: Duration,
        client: C,
        req: Req,
        open: F,
        drain: D,
    ) -> Result<Out, TalosError>
    where
        C: Clone,
        Req: Clone,
        F: Fn(C, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Streaming<Item>>, Status>>,
        D: Fn(Streaming<Item>) -> DFut,
        DFut: Future<Output = Result<Out, Status>>,
    {
        self.idempotent(rpc, || async {
            let read = async {
                let stream = open(client.clone(), self.request(req.clone(), d))
                    .await?
                    .into_inner();
                drain(stream).await.map(Response::new)
            };
            self.once(rpc, d, read).await
        })
        .await
    }
}

/// Reads a `common.Data` stream to its end.
pub(super) async fn collect_data(
    mut stream: Streaming<common::Data>,
) -> Result<Vec<common::Data>, Status> {
    let mut out = Vec::new();
    let mut total = 0usize;
    while let Some(chunk) = stream.message().await? {
        total = total.saturating_add(chunk.bytes.len());
        if total > MAX_MESSAGE_SIZE {
            return Err(Status::resource_exhausted(
                "kubeconfig stream larger than 32 MiB",
            ));
        }
        out.push(chunk);
    }
    Ok(out)
}

/// Reply entries that carry `common.Metadata` in field 1.
pub(super) trait HasMetadata {
    fn metadata(&self) -> Option<&common::Metadata>;
}

macro_rules! has_metadata {
    ($($t:ty),* $(,)?) => {
        $(impl HasMetadata for $t {
            fn metadata(&self) -> Option<&common::Metadata> {
                self.metadata.as_ref()
            }
        })*
    };
}

has_metadata!(
    machine::Version,
    machine::ApplyConfiguration,
    machine::Bootstrap,
    machine::Reset,
    machine::Reboot,
    machine::ServiceList,
    machine::EtcdMembers,
    storage::Disks,
    common::Data,
);

/// A unary reply and the one entry a single-node call takes from it.
pub(super) trait Reply {
    type Entry;
    fn into_entry(self, ctx: &CallContext) -> Result<Self::Entry, TalosError>;
}

/// Replies that list per-node entries in `messages`: each is checked for `metadata.error`,
/// and a single-node call gets exactly one.
macro_rules! entries_reply {
    ($($resp:ty => $entry:ty),* $(,)?) => {
        $(impl Reply for $resp {
            type Entry = $entry;
            fn into_entry(self, ctx: &CallContext) -> Result<$entry, TalosError> {
                single(check_entries(self.messages, ctx)?, ctx)
            }
        })*
    };
}

entries_reply!(
    machine::VersionResponse => machine::Version,
    machine::ApplyConfigurationResponse => machine::ApplyConfiguration,
    machine::BootstrapResponse => machine::Bootstrap,
    machine::ResetResponse => machine::Reset,
    machine::RebootResponse => machine::Reboot,
    machine::ServiceListResponse => machine::ServiceList,
    machine::EtcdMemberListResponse => machine::EtcdMembers,
    storage::DisksResponse => storage::Disks,
);

impl Reply for cosi::GetResponse {
    type Entry = cosi::Resource;
    fn into_entry(self, ctx: &CallContext) -> Result<cosi::Resource, TalosError> {
        self.resource
            .ok_or_else(|| malformed(ctx, "no resource in reply"))
    }
}

/// Fails if any reply entry carries `metadata.error` (the way apid reports a per-node
/// failure inside an OK reply), mapping it like a real status.
pub(super) fn check_entries<T: HasMetadata>(
    entries: Vec<T>,
    ctx: &CallContext,
) -> Result<Vec<T>, TalosError> {
    for entry in &entries {
        if let Some(err) = entry_error(entry.metadata(), ctx) {
            return Err(err);
        }
    }
    Ok(entries)
}

pub(super) fn entry_error(
    meta: Option<&common::Metadata>,
    ctx: &CallContext,
) -> Option<TalosError> {
    let meta = meta?;
    if meta.error.is_empty() && meta.status.as_ref().is_none_or(|s| s.code == 0) {
        return None;
    }
    let code = meta
        .status
        .as_ref()
        .map(|s| tonic::Code::from_i32(s.code))
        .filter(|c| *c != tonic::Code::Ok)
        .unwrap_or(tonic::Code::Unknown);
    let message = if meta.error.is_empty() {
        meta.status
            .as_ref()
            .map(|s| s.message.clone())
            .unwrap_or_default()
    } else {
        meta.error.clone()
    };
    let mut ctx = ctx.clone();
    if !meta.hostname.is_empty() {
        ctx.target.node = Some(meta.hostname.clone());
    }
    Some(classify_code(code, &message, &ctx))
}

/// Single-node calls get exactly one entry back; anything else is not what Talos sends.
pub(super) fn single<T>(mut entries: Vec<T>, ctx: &CallContext) -> Result<T, TalosError> {
    match entries.len() {
        1 => Ok(entries.remove(0)),
        0 => Err(malformed(ctx, "the reply holds no entry")),
        n => Err(malformed(
            ctx,
            &format!("the reply holds {n} entries for a single-node call"),
        )),
    }
}

pub(super) fn malformed(ctx: &CallContext, detail: &str) -> TalosError {
    TalosError::Malformed {
        target: ctx.target.clone(),
        rpc: ctx.rpc,
        detail: detail.to_owned(),
    }
}

/// Decodes a COSI resource's typed spec from `proto_spec`.
pub(super) fn decode_spec<T: Message + Default>(
    res: &cosi::Resource,
    ctx: &CallContext,
) -> Result<T, TalosError> {
    let spec = res
        .spec
        .as_ref()
        .ok_or_else(|| malformed(ctx, "resource without spec"))?;
    T::decode(spec.proto_spec.as_slice())
        .map_err(|e| malformed(ctx, &format!("cannot decode proto_spec: {e}")))
}
