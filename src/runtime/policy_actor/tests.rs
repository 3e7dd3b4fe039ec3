//! The generic policy actor on a toy kind: passes one at a time, triggers
//! merged, restarts, status writes deduplicated, node actors stopped.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;

use super::*;
use crate::test_support::{NOWHERE, context, empty_stores};

/// A node actor that counts its stops.
struct ToyNode(Arc<AtomicUsize>);

impl Actor for ToyNode {
    type Context = actix::Context<Self>;
    fn stopped(&mut self, _: &mut Self::Context) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// `BG`: the status written in the background.
struct Toy<const BG: bool = false> {
    ctx: Arc<Context>,
    /// Each pass: its trigger and the passes its memory had seen before.
    passes: Mutex<Vec<(Vec<u32>, u32)>>,
    /// A pass waits for a permit before it ends.
    gate: Semaphore,
    /// The status each pass returns, and whether the object shows it.
    status: Mutex<(u32, bool)>,
    writes: Mutex<Vec<u32>>,
    /// A background write waits for a permit before it ends.
    write_gate: Semaphore,
    /// Node actors stopped.
    stopped: Arc<AtomicUsize>,
    /// The nodes each pass keeps an actor for.
    nodes: Mutex<Vec<String>>,
}

impl<const BG: bool> PolicyKind for Toy<BG> {
    const ACTOR: &'static str = "toy_policy";
    const KIND: &'static str = "toy";
    const STATUS_IN_BACKGROUND: bool = BG;
    type Trigger = Vec<u32>;
    type Memory = u32;
    type Status = u32;
    type WriteNote = ();
    type Node = ToyNode;

    fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    fn merge(waiting: &mut Vec<u32>, next: Vec<u32>) {
        waiting.extend(next);
    }

    async fn pass(
        self: Arc<Self>,
        _name: String,
        trigger: Vec<u32>,
        mut memory: Memory<Self>,
    ) -> PassEnd<Self> {
        {
            self.passes
                .lock()
                .expect("lock")
                .push((trigger, memory.kind));
            memory.kind += 1;
            let nodes = self.nodes.lock().expect("lock").clone();
            memory.nodes.retain(|n| nodes.iter().any(|k| k == n));
            for n in &nodes {
                let stopped = self.stopped.clone();
                memory.nodes.get_or_start(n, || ToyNode(stopped).start());
            }
            self.gate.acquire().await.expect("gate").forget();
            let (status, on_object) = *self.status.lock().expect("lock");
            PassEnd {
                memory,
                status: Some(StatusOut {
                    status,
                    on_object,
                    note: (),
                }),
                result: Ok(()),
            }
        }
    }

    fn status_target(name: &str) -> WriteTarget {
        WriteTarget::PolicyStatus(name.to_string())
    }

    fn write_status(
        self: Arc<Self>,
        _name: String,
        status: &u32,
        _: &(),
    ) -> impl Future<Output = Result<()>> + 'static {
        let status = *status;
        async move {
            self.writes.lock().expect("lock").push(status);
            if BG {
                self.write_gate.acquire().await.expect("gate").forget();
            }
            Ok(())
        }
    }

    fn count_status_error(&self, name: &str) {
        self.ctx.metrics.inc_error(name, "status");
    }
}

fn toy<const BG: bool>() -> Arc<Toy<BG>> {
    Arc::new(Toy {
        ctx: context(NOWHERE, empty_stores()),
        passes: Mutex::default(),
        gate: Semaphore::new(0),
        status: Mutex::new((7, true)),
        writes: Mutex::default(),
        write_gate: Semaphore::new(0),
        stopped: Arc::default(),
        nodes: Mutex::default(),
    })
}

/// Waits until `done` holds (2 s at most).
async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..200 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

fn passes<const BG: bool>(k: &Toy<BG>) -> Vec<(Vec<u32>, u32)> {
    k.passes.lock().expect("lock").clone()
}

#[actix::test]
async fn a_trigger_during_a_pass_runs_exactly_one_more_with_the_triggers_merged() {
    let k = toy::<false>();
    let a = PolicyActor::new(k.clone(), "p".into()).start();
    a.do_send(RunPass(vec![1]));
    until("the first pass", || passes(&k).len() == 1).await;
    a.do_send(RunPass(vec![2]));
    let third = a.send(RunPass(vec![3]));
    // Let the triggers arrive while the first pass waits.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(passes(&k).len(), 1, "a second pass started mid-pass");
    k.gate.add_permits(1);
    until("the second pass", || passes(&k).len() == 2).await;
    k.gate.add_permits(5);
    // The reply comes when the pass that served the trigger ends.
    third.await.expect("mailbox").expect("pass");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(passes(&k), vec![(vec![1], 0), (vec![2, 3], 1)]);
}

#[actix::test]
async fn an_unchanged_status_the_object_shows_is_written_once() {
    let k = toy::<false>();
    k.gate.add_permits(100);
    let a = PolicyActor::new(k.clone(), "p".into()).start();
    for _ in 0..3 {
        a.send(RunPass(vec![]))
            .await
            .expect("mailbox")
            .expect("pass");
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert_eq!(passes(&k).len(), 3);
    assert_eq!(*k.writes.lock().expect("lock"), vec![7]);
    // A changed status is written; so is one the object does not show.
    *k.status.lock().expect("lock") = (8, true);
    a.send(RunPass(vec![]))
        .await
        .expect("mailbox")
        .expect("pass");
    tokio::time::sleep(Duration::from_millis(30)).await;
    *k.status.lock().expect("lock") = (8, false);
    a.send(RunPass(vec![]))
        .await
        .expect("mailbox")
        .expect("pass");
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(*k.writes.lock().expect("lock"), vec![7, 8, 8]);
}

#[actix::test]
async fn a_restart_starts_the_memory_afresh_and_is_counted() {
    let k = toy::<false>();
    k.gate.add_permits(100);
    *k.nodes.lock().expect("lock") = vec!["n1".into()];
    let a = actix::Supervisor::start({
        let k = k.clone();
        move |_| PolicyActor::new(k, "p".into())
    });
    a.send(RunPass(vec![1]))
        .await
        .expect("mailbox")
        .expect("pass");
    a.send(RunPass(vec![2]))
        .await
        .expect("mailbox")
        .expect("pass");
    until("two passes", || passes(&k).len() == 2).await;
    // Under a Supervisor, a stop is a restart.
    a.send(Stop).await.expect("mailbox");
    tokio::time::sleep(Duration::from_millis(50)).await;
    a.send(RunPass(vec![3]))
        .await
        .expect("mailbox")
        .expect("pass");
    until("a pass after the restart", || passes(&k).len() == 3).await;
    assert_eq!(passes(&k)[2], (vec![3], 0), "the memory was not reset");
    // The status written before is forgotten: written again.
    until("the status written again", || {
        k.writes.lock().expect("lock").len() == 2
    })
    .await;
    // The old node actor went with the old memory.
    until("the old node actor stopped", || {
        k.stopped.load(Ordering::SeqCst) == 1
    })
    .await;
    let (_, body) = k.ctx.metrics.encode();
    let text = String::from_utf8(body).expect("utf-8");
    assert!(
        text.lines()
            .any(|l| l.starts_with("ttdriver_actor_restarts_total")
                && l.contains("actor=\"toy_policy\"")
                && l.ends_with(" 1")),
        "{text}"
    );
}

#[actix::test]
async fn a_stop_stops_the_node_actors_and_a_node_gone_stops_its_own() {
    let k = toy::<false>();
    k.gate.add_permits(100);
    *k.nodes.lock().expect("lock") = vec!["n1".into(), "n2".into(), "n3".into()];
    let a = PolicyActor::new(k.clone(), "p".into()).start();
    a.send(RunPass(vec![]))
        .await
        .expect("mailbox")
        .expect("pass");
    until("the pass", || k.writes.lock().expect("lock").len() == 1).await;
    assert_eq!(k.stopped.load(Ordering::SeqCst), 0);
    *k.nodes.lock().expect("lock") = vec!["n1".into(), "n3".into()];
    a.send(RunPass(vec![]))
        .await
        .expect("mailbox")
        .expect("pass");
    until("n2's actor stopped", || {
        k.stopped.load(Ordering::SeqCst) == 1
    })
    .await;
    a.send(Stop).await.expect("mailbox");
    until("every node actor stopped", || {
        k.stopped.load(Ordering::SeqCst) == 3
    })
    .await;
}

#[actix::test]
async fn a_background_write_lets_the_next_pass_run_and_holds_the_next_write() {
    let k = toy::<true>();
    k.gate.add_permits(100);
    let a = PolicyActor::new(k.clone(), "p".into()).start();
    a.send(RunPass(vec![1]))
        .await
        .expect("mailbox")
        .expect("pass");
    until("the first write", || {
        k.writes.lock().expect("lock").len() == 1
    })
    .await;
    // The write hangs; passes go on and their changed status waits for it.
    *k.status.lock().expect("lock") = (8, true);
    a.send(RunPass(vec![2]))
        .await
        .expect("mailbox")
        .expect("pass");
    a.send(RunPass(vec![3]))
        .await
        .expect("mailbox")
        .expect("pass");
    assert_eq!(passes(&k).len(), 3);
    assert_eq!(*k.writes.lock().expect("lock"), vec![7]);
    // Once it is taken in, the next pass writes its status, once.
    k.write_gate.add_permits(100);
    tokio::time::sleep(Duration::from_millis(50)).await;
    a.send(RunPass(vec![4]))
        .await
        .expect("mailbox")
        .expect("pass");
    tokio::time::sleep(Duration::from_millis(50)).await;
    a.send(RunPass(vec![5]))
        .await
        .expect("mailbox")
        .expect("pass");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(*k.writes.lock().expect("lock"), vec![7, 8]);
}
