//! Leader election on a coordination.k8s.io Lease. Only the holder acts. A leader
//! that cannot renew before its lease runs out exits at once (the Deployment
//! restarts it as a follower), so two controllers never act together.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: i64,
}

impl LeaderElector {
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration_seconds: i64,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
            duration: duration_seconds.max(2),
        }
    }

    /// Tries once to acquire or renew; true when we hold the lease afterwards.
    pub async fn try_acquire(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let existing = self.api.get_opt(&self.name).await?;
        let Some(mut lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(now, now, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let renewed = spec
            .renew_time
            .as_ref()
            .map(|t| t.0)
            .unwrap_or(Timestamp::UNIX_EPOCH);
        let duration = i64::from(spec.lease_duration_seconds.unwrap_or(self.duration as i32));
        let expired = renewed.as_second() + duration < now.as_second();
        if holder != self.identity && !expired && !holder.is_empty() {
            return Ok(false);
        }
        let (acquired, transitions) = if holder == self.identity {
            (
                spec.acquire_time.map(|t| t.0).unwrap_or(now),
                spec.lease_transitions.unwrap_or(0),
            )
        } else {
            (now, spec.lease_transitions.unwrap_or(0) + 1)
        };
        lease.spec = Some(self.spec(acquired, now, transitions));
        // replace() carries resourceVersion: a concurrent taker gets 409 and loses.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn spec(&self, acquired: Timestamp, renewed: Timestamp, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration as i32),
            acquire_time: Some(MicroTime(acquired)),
            renew_time: Some(MicroTime(renewed)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// Blocks until this process holds the lease.
    pub async fn acquire(&self) {
        loop {
            match self.try_acquire().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "leader election: cannot read or write the Lease")
                }
            }
            tokio::time::sleep(Duration::from_secs(((self.duration / 5).max(1)) as u64)).await;
        }
    }

    /// Renews every third of the lease; returns when the lease is lost (renewal
    /// refused, or failing for longer than the lease lasts).
    pub async fn hold(&self) {
        let period = Duration::from_millis((self.duration * 1000 / 3) as u64);
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(period).await;
            match self.try_acquire().await {
                Ok(true) => last_ok = tokio::time::Instant::now(),
                // A conflict may be our own renewal racing a read: look once more
                // before giving the lease up.
                Ok(false) if matches!(self.try_acquire().await, Ok(true)) => {
                    last_ok = tokio::time::Instant::now()
                }
                Ok(false) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "leader election: renewal failed");
                    if last_ok.elapsed() >= Duration::from_secs(self.duration as u64) - period {
                        return;
                    }
                }
            }
        }
    }
}
