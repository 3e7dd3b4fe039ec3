//! Command-line flags (each also settable from the environment, as the chart does).

use clap::Parser;
use std::collections::BTreeMap;
use ttdrv_api::labels;

#[derive(Parser, Clone, Debug)]
#[command(
    name = "ttdrv-controller",
    version,
    about = "Rolls tt-kmd out across Tenstorrent nodes"
)]
pub struct Config {
    /// Operator namespace: installer DaemonSets and the leader Lease live here.
    #[arg(long, env = "TTDRV_NAMESPACE", default_value = labels::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Installer (agent) image used when a policy sets no `installer.image`
    /// (or names the Go operator's builder). Default: our agent image at this
    /// controller's version. The Go builder image is refused at start-up.
    #[arg(
        long,
        env = "TTDRV_INSTALLER_IMAGE",
        default_value = ttdrv_api::images::DEFAULT_AGENT_IMAGE,
        value_parser = parse_installer_image
    )]
    pub installer_image: String,
    /// Pull policy of the default installer image (a policy's own
    /// `installer.imagePullPolicy` wins when set to something other than IfNotPresent).
    #[arg(long, env = "TTDRV_INSTALLER_PULL_POLICY", default_value = "IfNotPresent",
          value_parser = ["Always", "IfNotPresent", "Never"])]
    pub installer_pull_policy: String,
    /// Flasher image of the flash Jobs when a firmware policy sets no
    /// `flasher.image` (the chart's `flasher.image`).
    #[arg(long, env = "TTDRV_FLASHER_IMAGE", default_value = ttdrv_api::images::DEFAULT_FLASHER_IMAGE)]
    pub flasher_image: String,
    #[arg(long, env = "TTDRV_FLASHER_PULL_POLICY", default_value = "IfNotPresent",
          value_parser = ["Always", "IfNotPresent", "Never"])]
    pub flasher_pull_policy: String,
    /// Flash nothing: the flash Jobs run the flasher on a simulated host in
    /// this host directory (`TTDRV_FLASH_SIMULATE`; its `cards.json` are the
    /// cards). For tests and demos only (the chart's `flasher.simulateDir`).
    #[arg(long, env = "TTDRV_FLASHER_SIMULATE_DIR")]
    pub flasher_simulate_dir: Option<String>,
    /// Run the firmware policy controller (TenstorrentFirmwarePolicy).
    #[arg(long, env = "TTDRV_FIRMWARE", default_value_t = true, action = clap::ArgAction::Set)]
    pub firmware: bool,
    /// When a driver policy and a firmware policy both have work for a
    /// node, cordon and drain it once for both: the flash goes first and
    /// hands its cordon to the swap. Off: each cycle cordons and drains on
    /// its own (one after the other). The chart's
    /// `controller.combineFirmwareAndDriver`.
    #[arg(long, env = "TTDRV_COMBINE_FIRMWARE_AND_DRIVER", default_value_t = true, action = clap::ArgAction::Set)]
    pub combine_firmware_and_driver: bool,
    /// tt-kmd git repository used when a policy sets no `installer.sourceRepository`.
    #[arg(long, env = "TTDRV_SOURCE_REPOSITORY", default_value = "")]
    pub source_repository: String,
    /// tt-smi version baked into the installer image (passed to the agent).
    /// `VERSION=COMMIT`: the commit the tag `ttkmd-VERSION` must name (the
    /// chart's `driver.sourceCommits`); a policy's
    /// `spec.installer.sourceCommit` overrides it. Repeat or comma-separate.
    #[arg(long = "source-commit", env = "TTDRV_SOURCE_COMMITS", value_delimiter = ',',
          value_parser = parse_commit_entry)]
    pub source_commits: Vec<String>,

    /// A ConfigMap in the operator namespace whose `keys.asc` holds the public
    /// keys that must have signed each version's tag (the chart's
    /// `driver.sourceTagKeys`); mounted into the installer pods. Unset: tag
    /// signatures are not checked.
    #[arg(long, env = "TTDRV_SOURCE_TAG_KEYS_CONFIGMAP")]
    pub source_tag_keys_configmap: Option<String>,

    /// Installer images a policy may name (`spec.installer.image`): exact, or a
    /// prefix ending in `*`. Empty: any. Outside it a policy is refused.
    #[arg(long, env = "TTDRV_ALLOWED_INSTALLER_IMAGES", value_delimiter = ',')]
    pub allowed_installer_images: Vec<String>,

    /// Source repositories a policy may name (`spec.installer.sourceRepository`),
    /// as for the images.
    #[arg(long, env = "TTDRV_ALLOWED_SOURCE_REPOSITORIES", value_delimiter = ',')]
    pub allowed_source_repositories: Vec<String>,

    #[arg(long, env = "TTDRV_TT_SMI_VERSION", default_value = "")]
    pub tt_smi_version: String,
    /// ServiceAccount of the installer pods.
    #[arg(long, env = "TTDRV_AGENT_SERVICE_ACCOUNT")]
    pub agent_service_account: Option<String>,
    /// Namespaces whose pods no drain evicts (comma-separated). Default: the
    /// operator's namespace, as the Go operator's drain: the controller is
    /// never evicted from the node it drains. An empty value exempts none.
    #[arg(long, env = "TTDRV_DRAIN_EXEMPT_NAMESPACES", value_delimiter = ',')]
    pub drain_exempt_namespaces: Option<Vec<String>>,
    /// Node labels set to "false" while a node is upgraded (comma-separated; empty disables).
    #[arg(long, env = "TTDRV_DEPLOY_GATES", default_value = labels::DEFAULT_DEPLOY_GATES, value_delimiter = ',')]
    pub deploy_gates: Vec<String>,
    /// The DRA kubelet plugin's pods (`key=value[,key=value]`), restarted on
    /// a swapped node before its uncordon so they publish the new driver's
    /// cards; empty: none restarted. The chart's
    /// `controller.schedulingSurface.draPluginSelector`.
    #[arg(long, env = "TTDRV_DRA_PLUGIN_SELECTOR", default_value = labels::DEFAULT_DRA_PLUGIN_SELECTOR,
          value_parser = parse_plugin_selector)]
    pub dra_plugin_selector: String,
    /// The DRA driver whose ResourceSlices must list a swapped node's cards
    /// before its uncordon (`controller.schedulingSurface.draDriver`).
    #[arg(long, env = "TTDRV_DRA_DRIVER", default_value = labels::DEFAULT_DRA_DRIVER)]
    pub dra_driver: String,
    /// Seconds a swapped node waits for the scheduler to see every card
    /// again before it fails `DevicesNotPublished`
    /// (`controller.schedulingSurface.timeoutSeconds`).
    #[arg(long, env = "TTDRV_SCHEDULING_SURFACE_TIMEOUT_SECONDS",
          default_value_t = ttdrv_core::machine::DEFAULT_SURFACE_TIMEOUT_SECONDS,
          value_parser = clap::value_parser!(i64).range(1..))]
    pub scheduling_surface_timeout_seconds: i64,
    /// Seconds a node may stay in Upgrading before it is marked Failed.
    #[arg(long, env = "TTDRV_UPGRADE_TIMEOUT_SECONDS", default_value_t = 900)]
    pub upgrade_timeout_seconds: i64,
    /// Fleet-health brake: a policy starts no node while more than this
    /// percentage of its nodes is NotReady (0-100).
    #[arg(long, env = "TTDRV_NOT_READY_BRAKE_PERCENT", default_value_t = ttdrv_core::rollout::DEFAULT_BRAKE_PERCENT,
          value_parser = clap::value_parser!(u32).range(0..=100))]
    pub not_ready_brake_percent: u32,
    /// Only act on policies matching this label selector (sharding, tests).
    #[arg(long, env = "TTDRV_POLICY_SELECTOR")]
    pub policy_selector: Option<String>,
    /// Before taking part in leader election, wait until no controller pod
    /// of the Go operator (label `app.kubernetes.io/component=controller`, a
    /// `manager` container) runs in the namespace: a `helm upgrade` from the
    /// Go chart starts this pod before it stops the Go one.
    #[arg(long, env = "TTDRV_WAIT_FOR_GO_CONTROLLER", default_value_t = true, action = clap::ArgAction::Set)]
    pub wait_for_go_controller: bool,
    /// Take part in leader election; only the leader acts.
    #[arg(long, env = "TTDRV_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    #[arg(
        long,
        env = "TTDRV_LEASE_NAME",
        default_value = "tt-k8s-driver-manager"
    )]
    pub lease_name: String,
    #[arg(long, env = "TTDRV_LEASE_DURATION_SECONDS", default_value_t = 15)]
    pub lease_duration_seconds: i64,
    /// Identity in the Lease (the pod name in a cluster).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Admin server: /metrics, /healthz, /readyz.
    #[arg(long, env = "TTDRV_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    pub admin_addr: std::net::SocketAddr,
    /// Periodic re-evaluation of nodes in the middle of a cycle (deadlines,
    /// eviction retries), in milliseconds.
    #[arg(long, env = "TTDRV_RESYNC_MS", default_value_t = 2000)]
    pub resync_ms: u64,
    /// Periodic pass over every node of every policy, a safety net behind the
    /// watches (which drive everything else), in milliseconds.
    #[arg(long, env = "TTDRV_FULL_RESYNC_MS", default_value_t = 30000)]
    pub full_resync_ms: u64,
    /// Require the NFD label `feature.node.kubernetes.io/pci-1200_1e52.present=true`
    /// on selected nodes (false for clusters without NFD: the policy's selector
    /// alone picks the nodes). The chart's `controller.requireTenstorrentLabel`.
    #[arg(long, env = "TTDRV_REQUIRE_TT_LABEL", default_value_t = true, action = clap::ArgAction::Set)]
    pub require_tenstorrent_label: bool,
    /// Log format: json or text. Text is coloured only on a terminal
    /// ([`log_colours`]).
    #[arg(long, env = "TTDRV_LOG_FORMAT", default_value = "text")]
    pub log_format: String,
}

/// `--dra-plugin-selector`: empty, or `key=value[,key=value]`.
fn parse_plugin_selector(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Ok(String::new());
    }
    ttdrv_core::surface::parse_selector(s).map(|_| s.to_string())
}

/// The installer image, refused when it is the Go operator's builder (which
/// does not speak to this controller): its pods would never report.
fn parse_installer_image(s: &str) -> Result<String, String> {
    if ttdrv_api::images::is_go_builder(s) {
        return Err(format!(
            "{s:?} is the Go operator's builder image, which does not speak to this controller: \
             set the chart's driver.image.repository to our agent image, {} (or a mirror of it)",
            ttdrv_api::images::AGENT_REPOSITORY
        ));
    }
    Ok(s.trim().to_string())
}

/// One `VERSION=COMMIT` entry, checked as the controller starts.
fn parse_commit_entry(s: &str) -> Result<String, String> {
    ttdrv_core::trust::parse_commit_table(&[s.to_string()]).map(|_| s.trim().to_string())
}

fn non_empty(list: &[String]) -> Vec<String> {
    list.iter()
        .map(|e| e.trim().to_string())
        .filter(|e| !e.is_empty())
        .collect()
}

impl Config {
    /// The namespaces drains leave alone (see `--drain-exempt-namespaces`).
    pub fn drain_exempt_namespaces(&self) -> Vec<String> {
        match &self.drain_exempt_namespaces {
            None => vec![self.namespace.clone()],
            Some(list) => non_empty(list),
        }
    }

    /// The version → commit table (a later entry for a version wins).
    pub fn source_commit_table(&self) -> BTreeMap<String, String> {
        self.source_commits
            .iter()
            .filter_map(|e| ttdrv_core::trust::parse_commit_table(std::slice::from_ref(e)).ok())
            .flatten()
            .collect()
    }

    /// The allow-lists of installer images and source repositories.
    pub fn allow_list(&self) -> ttdrv_core::trust::AllowList {
        ttdrv_core::trust::AllowList {
            images: non_empty(&self.allowed_installer_images),
            repositories: non_empty(&self.allowed_source_repositories),
        }
    }

    /// Who publishes the cards to the scheduler ([`ttdrv_core::surface`]).
    pub fn surface(&self) -> ttdrv_core::surface::SurfaceConfig {
        ttdrv_core::surface::SurfaceConfig {
            plugin_selector: ttdrv_core::surface::parse_selector(&self.dra_plugin_selector)
                .unwrap_or_default(),
            driver: self.dra_driver.clone(),
        }
    }

    pub fn gates(&self) -> Vec<String> {
        self.deploy_gates
            .iter()
            .map(|g| g.trim().to_string())
            .filter(|g| !g.is_empty())
            .collect()
    }

    pub fn source_repository(&self) -> String {
        if self.source_repository.is_empty() {
            labels::DEFAULT_SOURCE_REPOSITORY.to_string()
        } else {
            self.source_repository.clone()
        }
    }
}

/// The proxy variables copied from the controller's environment into the
/// installer pods (as the Go operator did), both cases.
pub const PROXY_VARS: [&str; 6] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
];

/// The proxy variables set (non-empty) in `env`, in [`PROXY_VARS`] order.
pub fn proxy_env(env: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    PROXY_VARS
        .iter()
        .filter_map(|k| env(k).filter(|v| !v.is_empty()).map(|v| (k.to_string(), v)))
        .collect()
}

/// Whether the text log carries colour escapes: only when it goes to a
/// terminal, and never with `NO_COLOR` set (no-color.org). A log file or a
/// pod's log (`kubectl logs`) gets plain text.
pub fn log_colours(writes_to_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    writes_to_terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_exempt_the_operator_namespace_unless_told_otherwise() {
        let parse = |args: &[&str]| {
            let mut all = vec!["ttdrv-controller", "--namespace", "tt"];
            all.extend_from_slice(args);
            Config::try_parse_from(all)
                .expect("parses")
                .drain_exempt_namespaces()
        };
        assert_eq!(parse(&[]), ["tt"]);
        assert_eq!(
            parse(&["--drain-exempt-namespaces", "tt, monitoring"]),
            ["tt", "monitoring"]
        );
        assert!(parse(&["--drain-exempt-namespaces="]).is_empty());
    }

    #[test]
    fn the_default_installer_is_our_agent_and_the_go_builder_is_refused() {
        let c = Config::try_parse_from(["ttdrv-controller"]).expect("defaults");
        assert_eq!(c.installer_image, ttdrv_api::images::DEFAULT_AGENT_IMAGE);
        assert!(
            c.installer_image
                .starts_with(ttdrv_api::images::AGENT_REPOSITORY)
        );
        let e = Config::try_parse_from([
            "ttdrv-controller",
            "--installer-image",
            "registry.local/mirror/tt-k8s-driver-manager-builder:v0.4.2",
        ])
        .expect_err("the Go builder");
        let e = e.to_string();
        assert!(
            e.contains("Go operator's builder") && e.contains("driver.image.repository"),
            "{e}"
        );
    }

    #[test]
    fn source_commits_and_allow_lists_parse_as_the_chart_passes_them() {
        let a = "0123456789abcdef0123456789abcdef01234567";
        let b = "89ABCDEF0123456789abcdef0123456789abcdef";
        let c = Config::try_parse_from([
            "ttdrv-controller",
            "--source-commit",
            &format!("2.8.0={a},2.7.0={b}"),
            "--allowed-installer-images",
            "ghcr.io/tenstorrent/*, registry.local/agent:1",
            "--allowed-source-repositories",
            "https://git.local/tt-kmd.git",
        ])
        .expect("parses");
        assert_eq!(
            c.source_commit_table(),
            BTreeMap::from([
                ("2.7.0".to_string(), b.to_lowercase()),
                ("2.8.0".to_string(), a.to_string())
            ])
        );
        let allow = c.allow_list();
        assert_eq!(
            allow.images,
            ["ghcr.io/tenstorrent/*", "registry.local/agent:1"]
        );
        assert_eq!(allow.repositories, ["https://git.local/tt-kmd.git"]);
        let defaults = Config::try_parse_from(["ttdrv-controller"]).expect("defaults");
        assert!(defaults.source_commit_table().is_empty());
        assert_eq!(
            defaults.allow_list(),
            ttdrv_core::trust::AllowList::default()
        );
        for bad in [
            "2.8.0=abc",
            "latest=0123456789abcdef0123456789abcdef01234567",
            "2.8.0",
        ] {
            let e = Config::try_parse_from(["ttdrv-controller", "--source-commit", bad])
                .expect_err(bad);
            assert!(e.to_string().contains("source commit"), "{bad}: {e}");
        }
    }

    #[test]
    fn proxy_env_copies_both_cases_and_skips_unset() {
        let got = proxy_env(|k| match k {
            "HTTPS_PROXY" => Some("http://proxy:3128".into()),
            "no_proxy" => Some("10.0.0.0/8,.svc".into()),
            "HTTP_PROXY" => Some(String::new()),
            _ => None,
        });
        assert_eq!(
            got,
            [
                ("HTTPS_PROXY".to_string(), "http://proxy:3128".to_string()),
                ("no_proxy".to_string(), "10.0.0.0/8,.svc".to_string()),
            ]
        );
    }

    #[test]
    fn require_tenstorrent_label_defaults_on() {
        let c = Config::try_parse_from(["ttdrv-controller"]).expect("parses");
        assert!(c.require_tenstorrent_label);
        let c =
            Config::try_parse_from(["ttdrv-controller", "--require-tenstorrent-label", "false"])
                .expect("parses");
        assert!(!c.require_tenstorrent_label);
    }

    /// No colour escapes in a log that is not a terminal (a file, a pipe,
    /// `kubectl logs`), nor with NO_COLOR set.
    #[test]
    fn log_colours_only_on_a_terminal() {
        use std::ffi::OsStr;
        assert!(log_colours(true, None));
        assert!(!log_colours(false, None));
        assert!(!log_colours(true, Some(OsStr::new("1"))));
        assert!(log_colours(true, Some(OsStr::new(""))));
    }
}
