//! One pass and one restore: the plans of [`crate::plan`] carried out on
//! sysfs, with a log line per function moved and the metrics updated.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ttdrv_api::vfio::{PciFunctions, VFIO_PCI_DRIVER};

use crate::config::Config;
use crate::error::{Result, VfioError};
use crate::metrics::Metrics;
use crate::plan::{self, Action, Function, Iommu};
use crate::state::{State, StateStore};
use crate::sysfs::{self, DRIVERS_PROBE, NOIOMMU_PARAM, Sysfs};

/// Why vfio-pci may still be missing after a modprobe.
const VFIO_PCI_HINT: &str = " after modprobe vfio-pci: does the host have it for its kernel, is /lib/modules mounted, the container privileged?";

#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `--noiommu`: turn vfio's no-IOMMU mode on for functions without an IOMMU group.
    pub allow_noiommu: bool,
    /// `--hotplug-stub-driver`: offered each function before vfio-pci.
    pub hotplug_stub: Option<String>,
}

/// What a pass found and did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassOutcome {
    /// Functions bound by this pass.
    pub bound: Vec<String>,
    /// Configured functions on vfio-pci after it.
    pub on_vfio: u32,
    pub errors: u32,
    /// The Node annotation's value and the board-types label.
    pub report: PciFunctions,
    pub board_types: Option<String>,
}

pub struct Binder {
    sysfs: Sysfs,
    config: Config,
    options: Options,
    state: State,
    store: Option<StateStore>,
    metrics: Arc<Metrics>,
}

impl Binder {
    /// Loads the saved state (when there is a store).
    pub fn new(
        sysfs: Sysfs,
        config: Config,
        options: Options,
        store: Option<StateStore>,
        metrics: Arc<Metrics>,
    ) -> Result<Binder> {
        let state = match &store {
            Some(s) => s.load()?,
            None => State::default(),
        };
        if !state.functions.is_empty() {
            tracing::info!(functions = ?state.functions.keys().collect::<Vec<_>>(), "recorded functions from the state file");
        }
        Ok(Binder {
            sysfs,
            config,
            options,
            state,
            store,
            metrics,
        })
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    fn scan(&self) -> Result<Vec<Function>> {
        let (functions, refused) = self.sysfs.scan()?;
        for e in refused {
            tracing::warn!(error = %e, "skipping a PCI function");
        }
        Ok(functions)
    }

    fn save(&mut self, next: State) {
        if next == self.state {
            return;
        }
        self.state = next;
        if let Some(store) = &self.store
            && let Err(e) = store.save(&self.state)
        {
            // The state in memory still serves this process's restore.
            tracing::error!(error = %e, "could not save the binder state");
        }
    }

    /// One pass: bind every configured function not on vfio-pci.
    pub fn pass(&mut self) -> Result<PassOutcome> {
        let functions = self.scan()?;
        let noiommu_on = self.sysfs.noiommu_mode()?.unwrap_or(false);
        let iommu = Iommu {
            noiommu_on,
            allow_noiommu: self.options.allow_noiommu,
        };
        let actions = plan::plan(&functions, &self.config, iommu);
        // Recorded before anything moves: a crash mid-bind still knows the original driver.
        self.save(plan::record(&self.state, &functions, &actions));

        let mut bound = BTreeSet::new();
        let mut errors = 0;
        // vfio-pci is loaded when there is something to bind, not before: a
        // node with no matching function (the DaemonSet without a
        // nodeSelector) runs without it instead of crash-looping.
        let wants_bind = actions.iter().any(|a| matches!(a, Action::Bind { .. }));
        let vfio_pci_missing = wants_bind && self.ensure_vfio_pci().is_err();
        for action in &actions {
            let result = match action {
                Action::Bind { .. } if vfio_pci_missing => Err(VfioError::DriverMissing {
                    driver: VFIO_PCI_DRIVER.into(),
                    hint: VFIO_PCI_HINT,
                }),
                Action::Bind { bdf, resource, from, enable_noiommu } => {
                    self.bind(bdf, from.as_deref(), *enable_noiommu).map(|()| {
                        let board = self.state.functions.get(bdf).map_or("unknown", |e| e.board_type.as_str());
                        tracing::info!(%bdf, %resource, board, from = from.as_deref().unwrap_or("none"), "bound to vfio-pci");
                        bound.insert(bdf.clone());
                    })
                }
                Action::RefuseNoIommu { bdf, .. } => Err(VfioError::IommuOff { bdf: bdf.clone() }),
            };
            if let Err(e) = result {
                errors += 1;
                self.metrics.bind_errors.with_label_values(&["bind"]).inc();
                tracing::error!(error = %e, "bind failed");
            }
        }
        let now = plan::after_pass(&functions, &bound);
        self.save(plan::record(&self.state, &now, &[]));
        let noiommu_now = self.sysfs.noiommu_mode()?.unwrap_or(false);
        self.metrics.noiommu_mode.set(i64::from(noiommu_now));
        Ok(self.publish(&now, bound.into_iter().collect(), errors))
    }

    /// Metrics and the Node report for the functions as they now are.
    fn publish(&self, now: &[Function], bound: Vec<String>, errors: u32) -> PassOutcome {
        let mut per_resource: BTreeMap<&str, u32> = self
            .config
            .devices
            .iter()
            .map(|g| (g.resource_name.as_str(), 0))
            .collect();
        let mut kinds = Vec::new();
        self.metrics.device_info.reset();
        for f in now {
            let Some(resource) = self.config.resource_of(f.ids.vendor, f.ids.device) else {
                continue;
            };
            let id = plan::identity(f, self.state.functions.get(&f.bdf));
            self.metrics
                .device_info
                .with_label_values(&[
                    &f.bdf,
                    resource,
                    &id.board_type,
                    id.serial.as_deref().unwrap_or(""),
                ])
                .set(1.0);
            kinds.push(id.board_type);
            if f.on_vfio() {
                *per_resource.entry(resource).or_insert(0) += 1;
            }
        }
        for (resource, n) in &per_resource {
            self.metrics
                .devices_bound
                .with_label_values(&[resource])
                .set(f64::from(*n));
        }
        PassOutcome {
            bound,
            on_vfio: per_resource.values().sum(),
            errors,
            report: plan::report(now, &self.config, &self.sysfs.boot_id()),
            board_types: plan::board_types(kinds.iter().map(String::as_str)),
        }
    }

    /// Loads vfio-pci when its driver is not registered.
    fn ensure_vfio_pci(&self) -> Result<()> {
        if self.sysfs.driver_exists(VFIO_PCI_DRIVER) {
            return Ok(());
        }
        tracing::info!("vfio-pci is not registered: modprobe vfio-pci");
        let loaded = self.sysfs.modprobe(VFIO_PCI_DRIVER);
        if let Err(e) = &loaded {
            tracing::error!(error = %e, "loading vfio-pci failed");
        }
        if self.sysfs.driver_exists(VFIO_PCI_DRIVER) {
            return Ok(());
        }
        loaded.and(Err(VfioError::DriverMissing {
            driver: VFIO_PCI_DRIVER.into(),
            hint: VFIO_PCI_HINT,
        }))
    }

    fn bind(&self, bdf: &str, from: Option<&str>, enable_noiommu: bool) -> Result<()> {
        let step = |op: &str, r: Result<()>| {
            r.map_err(|e| match e {
                VfioError::HostFs(source) => VfioError::Sysfs {
                    op: op.to_string(),
                    bdf: bdf.to_string(),
                    source,
                },
                e => e,
            })
        };
        if enable_noiommu {
            if self.sysfs.noiommu_mode()?.is_none() {
                return Err(VfioError::NoiommuUnsupported);
            }
            tracing::warn!(
                %bdf,
                "TURNING ON vfio's UNSAFE no-IOMMU mode (--noiommu): a VM given this function can DMA anywhere in host memory"
            );
            step(
                "turning on no-IOMMU mode for",
                self.sysfs.write(NOIOMMU_PARAM, "Y"),
            )?;
        }
        if let Some(driver) = from {
            step(
                &format!("unbinding from {driver}"),
                self.sysfs.driver_write(driver, "unbind", bdf),
            )?;
        }
        if let Some(stub) = &self.options.hotplug_stub {
            step(
                "setting driver_override of",
                self.sysfs.write_device(bdf, "driver_override", stub),
            )?;
            // The stub flags the function to ignore hotplug and declines it (ENODEV).
            match self.sysfs.driver_write(stub, "bind", bdf) {
                Err(e) if !sysfs::is_enodev(&e) => {
                    tracing::warn!(%bdf, %stub, error = %e, "the hotplug stub's probe failed otherwise than by declining")
                }
                _ => {}
            }
        }
        step(
            "setting driver_override of",
            self.sysfs
                .write_device(bdf, "driver_override", VFIO_PCI_DRIVER),
        )?;
        if let Err(e) = step(
            "binding to vfio-pci",
            self.sysfs.driver_write(VFIO_PCI_DRIVER, "bind", bdf),
        ) {
            // "\n", not "": an empty write never reaches the kernel, the pin would stay.
            if let Err(c) = self.sysfs.write_device(bdf, "driver_override", "\n") {
                tracing::warn!(%bdf, error = %c, "could not clear driver_override after the failed bind");
            }
            return Err(e);
        }
        Ok(())
    }

    /// Puts every recorded function still on vfio-pci back on its original
    /// driver (or lets the kernel probe one), and forgets it.
    pub fn restore(&mut self) -> Result<RestoreOutcome> {
        let functions = self.scan()?;
        let present: BTreeSet<&str> = functions.iter().map(|f| f.bdf.as_str()).collect();
        let mut out = RestoreOutcome::default();
        for r in plan::restore_plan(&functions, &self.state) {
            match self.restore_one(&r.bdf, r.to.as_deref()) {
                Ok(to) => {
                    tracing::info!(bdf = %r.bdf, to, "restored from vfio-pci");
                    out.restored.push(r.bdf);
                }
                Err(e) => {
                    out.errors += 1;
                    self.metrics
                        .bind_errors
                        .with_label_values(&["unbind"])
                        .inc();
                    tracing::error!(bdf = %r.bdf, error = %e, "restore failed");
                }
            }
        }
        // Kept: a function absent now (it may come back) or not restored;
        // forgotten: one restored or found on another driver.
        let on_vfio: BTreeSet<&str> = functions
            .iter()
            .filter(|f| f.on_vfio())
            .map(|f| f.bdf.as_str())
            .collect();
        let mut next = self.state.clone();
        next.functions.retain(|bdf, _| {
            !present.contains(bdf.as_str())
                || (on_vfio.contains(bdf.as_str()) && !out.restored.contains(bdf))
        });
        self.save(next);
        Ok(out)
    }

    /// Returns where the function went.
    fn restore_one(&self, bdf: &str, to: Option<&str>) -> Result<String> {
        self.sysfs.driver_write(VFIO_PCI_DRIVER, "unbind", bdf)?;
        self.sysfs.write_device(bdf, "driver_override", "\n")?;
        if let Some(driver) = to {
            match self.sysfs.driver_write(driver, "bind", bdf) {
                Ok(()) => return Ok(driver.to_string()),
                Err(e) => {
                    tracing::warn!(%bdf, %driver, error = %e, "binding back failed; letting the kernel probe")
                }
            }
        }
        self.sysfs.write(DRIVERS_PROBE, bdf)?;
        Ok("drivers_probe".to_string())
    }
}

/// What a restore put back, and how many functions it could not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreOutcome {
    pub restored: Vec<String>,
    pub errors: u32,
}
