//! One policy's actor, whatever its kind: the shell a kind's pass runs in.
//!
//! [`PolicyActor<K>`] owns what every kind needs and none should copy: one
//! pass at a time (a trigger during a pass runs one more after it, the
//! triggers merged), the memory passes keep between them (the kind's own,
//! the node actors by node name, the grant set of nodes holding a slot, the
//! status last written), a restart (`Supervised`) that starts that memory
//! afresh and counts `ttdriver_actor_restarts_total{actor=K::ACTOR}`, the
//! node actors stopped with the policy's actor, and the status written only
//! when it changed, under the per-object write backoff
//! ([`Context::guarded_write`]).
//!
//! A kind implements [`PolicyKind`]: its pass (observe, plan, step its node
//! actors, build its status) and how its status is written.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;

use actix::prelude::*;

use super::context::Context;
use super::write_backoff::WriteTarget;
use crate::{Error, Result};

/// A policy kind, as its [`PolicyActor`] runs it.
pub trait PolicyKind: Sized + Unpin + 'static {
    /// The `actor` label of the restart counter.
    const ACTOR: &'static str;
    /// The kind's word in log lines ("firmware").
    const KIND: &'static str;
    /// Whether the status is written off the pass (one write at a time; the
    /// next pass may start meanwhile) rather than before the pass ends.
    const STATUS_IN_BACKGROUND: bool;
    /// What a pass must look at; triggers that come while a pass runs are
    /// merged into one.
    type Trigger: Unpin + 'static;
    /// What the kind's passes remember between them.
    type Memory: Default + Unpin + 'static;
    /// The policy's status.
    type Status: PartialEq + Unpin + 'static;
    /// What a status write carries besides the status, handed back to
    /// [`PolicyKind::status_written`] once it is written.
    type WriteNote: Unpin + 'static;
    /// The kind's node actor, one per node the policy owns.
    type Node: Actor;

    /// The context every actor shares.
    fn context(&self) -> &Arc<Context>;

    /// Folds `next` into the trigger waiting for the next pass.
    fn merge(waiting: &mut Self::Trigger, next: Self::Trigger);

    /// One pass of policy `name`: it hands the memory back, with the status
    /// it wants written if any.
    fn pass(
        self: Arc<Self>,
        name: String,
        trigger: Self::Trigger,
        memory: Memory<Self>,
    ) -> impl Future<Output = PassEnd<Self>> + 'static;

    /// Where a write of `name`'s status counts its failures.
    fn status_target(name: &str) -> WriteTarget;

    /// Writes `status` as policy `name`'s.
    fn write_status(
        self: Arc<Self>,
        name: String,
        status: &Self::Status,
        note: &Self::WriteNote,
    ) -> impl Future<Output = Result<()>> + 'static;

    /// After a status write succeeded (and `memory.written` holds it).
    fn status_written(&self, _name: &str, _memory: &mut Memory<Self>, _note: Self::WriteNote) {}

    /// Counts a status write that failed in the kind's error metric.
    fn count_status_error(&self, name: &str);

    /// The memory after a restart, from the memory before (none when a pass
    /// had it): by default all afresh, which drops the node actors.
    fn restart(&self, _name: &str, _memory: Option<Memory<Self>>) -> Memory<Self> {
        Memory::default()
    }

    /// Tells a node actor its policy stopped. Dropping its address is
    /// enough for most; the default does nothing more.
    fn stop_node(_node: &Addr<Self::Node>) {}
}

/// What a pass hands back.
pub struct PassEnd<K: PolicyKind> {
    pub memory: Memory<K>,
    /// The status to write, if the pass built one.
    pub status: Option<StatusOut<K>>,
    /// The pass's outcome, the reply to the triggers it served.
    pub result: Result<()>,
}

/// A pass's status for its policy.
pub struct StatusOut<K: PolicyKind> {
    pub status: K::Status,
    /// The cached object already shows it: then a write is skipped when it
    /// is also the one last written.
    pub on_object: bool,
    pub note: K::WriteNote,
}

/// What a policy's passes remember between them.
pub struct Memory<K: PolicyKind> {
    /// The kind's own.
    pub kind: K::Memory,
    /// Node → its actor.
    pub nodes: NodeActors<K::Node>,
    /// Nodes holding a slot of the policy's budget.
    pub held: BTreeSet<String>,
    /// The status last written.
    pub written: Option<K::Status>,
    /// A status write is under way (set by the actor when a pass starts):
    /// a pass need not build one.
    pub status_in_flight: bool,
}

impl<K: PolicyKind> Default for Memory<K> {
    fn default() -> Self {
        Self {
            kind: K::Memory::default(),
            nodes: NodeActors::default(),
            held: BTreeSet::new(),
            written: None,
            status_in_flight: false,
        }
    }
}

/// A policy's node actors by node name; behind an `Arc` so a pass borrows
/// them without copying N entries.
pub struct NodeActors<N: Actor> {
    actors: Arc<HashMap<String, Addr<N>>>,
}

impl<N: Actor> Default for NodeActors<N> {
    fn default() -> Self {
        Self {
            actors: Arc::default(),
        }
    }
}

impl<N: Actor> NodeActors<N> {
    /// `node`'s actor, started by `start` when it has none.
    pub fn get_or_start(&mut self, node: &str, start: impl FnOnce() -> Addr<N>) -> Addr<N> {
        if let Some(a) = self.actors.get(node) {
            return a.clone();
        }
        let addr = start();
        Arc::make_mut(&mut self.actors).insert(node.to_string(), addr.clone());
        addr
    }

    /// Keeps the actors of the nodes `keep` says; the others are dropped
    /// (and stop once nothing else holds their address).
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        if self.actors.keys().any(|n| !keep(n)) {
            Arc::make_mut(&mut self.actors).retain(|n, _| keep(n));
        }
    }

    /// Takes `node`'s actor out.
    pub fn remove(&mut self, node: &str) -> Option<Addr<N>> {
        if !self.actors.contains_key(node) {
            return None;
        }
        Arc::make_mut(&mut self.actors).remove(node)
    }

    pub fn contains(&self, node: &str) -> bool {
        self.actors.contains_key(node)
    }

    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.actors.keys()
    }

    /// Every actor, shared.
    pub fn shared(&self) -> Arc<HashMap<String, Addr<N>>> {
        self.actors.clone()
    }

    pub fn len(&self) -> usize {
        self.actors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.actors.is_empty()
    }
}

/// The reply to a [`RunPass`]: the outcome of the pass that served it.
pub type PassResult = std::result::Result<(), Arc<Error>>;

type Waiters = Vec<tokio::sync::oneshot::Sender<PassResult>>;

/// A finished status write, to take in once the memory is back.
struct Written<K: PolicyKind> {
    res: Result<()>,
    status: K::Status,
    note: K::WriteNote,
}

/// One policy's actor of kind `K`.
pub struct PolicyActor<K: PolicyKind> {
    kind: Arc<K>,
    name: String,
    /// Taken while a pass runs.
    memory: Option<Memory<K>>,
    /// Triggers that came while a pass ran, and who waits for them.
    waiting: Option<(K::Trigger, Waiters)>,
    /// A background status write is under way.
    status_in_flight: bool,
    /// A background write that ended while a pass had the memory.
    written: Option<Written<K>>,
}

impl<K: PolicyKind> PolicyActor<K> {
    pub fn new(kind: Arc<K>, name: String) -> Self {
        Self {
            kind,
            name,
            memory: Some(Memory::default()),
            waiting: None,
            status_in_flight: false,
            written: None,
        }
    }

    fn start_pass(
        &mut self,
        trigger: K::Trigger,
        waiters: Waiters,
        actx: &mut actix::Context<Self>,
    ) {
        let Some(mut memory) = self.memory.take() else {
            match &mut self.waiting {
                Some((t, w)) => {
                    K::merge(t, trigger);
                    w.extend(waiters);
                }
                None => self.waiting = Some((trigger, waiters)),
            }
            return;
        };
        memory.status_in_flight = self.status_in_flight;
        let (kind, name) = (self.kind.clone(), self.name.clone());
        actx.spawn(
            async move {
                let mut end = kind.clone().pass(name.clone(), trigger, memory).await;
                if !K::STATUS_IN_BACKGROUND
                    && let Some(out) = end.status.take()
                    && !unchanged(&end.memory, &out)
                {
                    let res = write(&kind, &name, &out).await;
                    take_in(&*kind, &name, &mut end.memory, Written::of(res, out));
                }
                end
            }
            .into_actor(self)
            .map(move |end, act, actx| act.pass_ended(end, waiters, actx)),
        );
    }

    fn pass_ended(&mut self, end: PassEnd<K>, waiters: Waiters, actx: &mut actix::Context<Self>) {
        let PassEnd {
            mut memory,
            status,
            result,
        } = end;
        if let Some(w) = self.written.take() {
            self.status_in_flight = false;
            take_in(&*self.kind, &self.name, &mut memory, w);
        }
        if let Some(out) = status
            && !self.status_in_flight
            && !unchanged(&memory, &out)
        {
            self.write_in_background(out, actx);
        }
        self.memory = Some(memory);
        let reply = result.map_err(Arc::new);
        for w in waiters {
            let _ = w.send(reply.clone());
        }
        if let Some((next, waiters)) = self.waiting.take() {
            self.start_pass(next, waiters, actx);
        }
    }

    /// One write at a time, off the passes.
    fn write_in_background(&mut self, out: StatusOut<K>, actx: &mut actix::Context<Self>) {
        self.status_in_flight = true;
        let (kind, name) = (self.kind.clone(), self.name.clone());
        actx.spawn(
            async move {
                let res = write(&kind, &name, &out).await;
                Written::of(res, out)
            }
            .into_actor(self)
            .map(|w, act, _| match act.memory.as_mut() {
                Some(memory) => {
                    act.status_in_flight = false;
                    take_in(&*act.kind, &act.name, memory, w);
                }
                None => act.written = Some(w),
            }),
        );
    }
}

impl<K: PolicyKind> Written<K> {
    fn of(res: Result<()>, out: StatusOut<K>) -> Self {
        Self {
            res,
            status: out.status,
            note: out.note,
        }
    }
}

/// The status is the one last written, and the object shows it.
fn unchanged<K: PolicyKind>(memory: &Memory<K>, out: &StatusOut<K>) -> bool {
    out.on_object && memory.written.as_ref() == Some(&out.status)
}

/// Writes the status under the per-object write backoff, so a status the
/// API server keeps refusing is not sent again every pass. A conflict is a
/// write to retry with the next pass's view, not a refusal to back off from.
async fn write<K: PolicyKind>(kind: &Arc<K>, name: &str, out: &StatusOut<K>) -> Result<()> {
    let ctx = kind.context().clone();
    let write = kind
        .clone()
        .write_status(name.to_string(), &out.status, &out.note);
    ctx.guarded_write(K::status_target(name), |e| !e.is_conflict(), write)
        .await
}

/// A write's outcome, taken into the memory.
fn take_in<K: PolicyKind>(kind: &K, name: &str, memory: &mut Memory<K>, w: Written<K>) {
    match w.res {
        Ok(()) => {
            memory.written = Some(w.status);
            kind.status_written(name, memory, w.note);
        }
        Err(e @ Error::WriteHeld { .. }) => {
            tracing::debug!(policy = name, error = %e, "{} status write held back", K::KIND);
        }
        Err(e) => {
            // Retried by the next pass once its backoff has passed.
            kind.count_status_error(name);
            tracing::warn!(policy = name, error = %e, "{} status not written; will retry", K::KIND);
        }
    }
}

impl<K: PolicyKind> Actor for PolicyActor<K> {
    type Context = actix::Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
        if let Some(memory) = &self.memory {
            memory.nodes.actors.values().for_each(K::stop_node);
        }
    }
}

impl<K: PolicyKind> Supervised for PolicyActor<K> {
    fn restarting(&mut self, _: &mut Self::Context) {
        // What was under way went with the old context.
        self.memory = Some(self.kind.restart(&self.name, self.memory.take()));
        self.waiting = None;
        self.status_in_flight = false;
        self.written = None;
        self.kind.context().metrics.inc_actor_restart(K::ACTOR);
    }
}

/// Run a pass (after the one running, if any); the reply comes when the
/// pass that served it ends.
#[derive(Message)]
#[rtype(result = "PassResult")]
pub struct RunPass<T: 'static>(pub T);

impl<K: PolicyKind> Handler<RunPass<K::Trigger>> for PolicyActor<K> {
    type Result = ResponseFuture<PassResult>;

    fn handle(&mut self, msg: RunPass<K::Trigger>, actx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.start_pass(msg.0, vec![tx], actx);
        // A pass cut short (the actor stopped or restarted) replies nothing.
        Box::pin(async move { rx.await.unwrap_or(Ok(())) })
    }
}

/// The policy is gone: stop, and the node actors with it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;

impl<K: PolicyKind> Handler<Stop> for PolicyActor<K> {
    type Result = ();

    fn handle(&mut self, _: Stop, actx: &mut Self::Context) {
        actx.stop();
    }
}

#[cfg(test)]
mod tests;
