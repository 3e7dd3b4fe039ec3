//! Installer images: our agent's, and the Go operator's builder, which does
//! not speak to this controller (one definition for the controller, the
//! plugin and the chart's test).

/// Our agent image's repository (the chart's `driver.image.repository`).
pub const AGENT_REPOSITORY: &str = "ghcr.io/tenstorrent/tt-k8s-driver-manager-rs/agent";

/// The agent image at this build's version: the controller's installer image
/// when neither the chart nor the policy names one.
pub const DEFAULT_AGENT_IMAGE: &str = concat!(
    "ghcr.io/tenstorrent/tt-k8s-driver-manager-rs/agent:",
    env!("CARGO_PKG_VERSION")
);

/// Our flasher image's repository (the chart's `flasher.image.repository`).
pub const FLASHER_REPOSITORY: &str = "ghcr.io/tenstorrent/tt-k8s-driver-manager-rs/flasher";

/// The flasher image at this build's version: the flash Jobs' image when
/// neither the chart nor the firmware policy names one.
pub const DEFAULT_FLASHER_IMAGE: &str = concat!(
    "ghcr.io/tenstorrent/tt-k8s-driver-manager-rs/flasher:",
    env!("CARGO_PKG_VERSION")
);

/// The Go operator's installer image repository.
pub const GO_BUILDER_REPOSITORY: &str = "ghcr.io/tenstorrent/tt-k8s-driver-manager-builder";

/// The image's repository: without its `@digest` and its `:tag` (a `:` in
/// the registry host is a port, not a tag).
pub fn repository(image: &str) -> &str {
    let image = image.split_once('@').map_or(image, |(r, _)| r);
    match image.rfind(':') {
        Some(i) if !image[i..].contains('/') => &image[..i],
        _ => image,
    }
}

/// Whether `image` is the Go operator's builder, at ghcr.io or mirrored: its
/// repository's last path segment is the builder's.
pub fn is_go_builder(image: &str) -> bool {
    let builder = GO_BUILDER_REPOSITORY.rsplit('/').next().unwrap_or_default();
    repository(image.trim())
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        == Some(builder)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_strips_tag_and_digest_not_the_port() {
        assert_eq!(repository("a.io/x/y:1.2"), "a.io/x/y");
        assert_eq!(repository("a.io:5000/x/y"), "a.io:5000/x/y");
        assert_eq!(repository("a.io:5000/x/y:v1"), "a.io:5000/x/y");
        assert_eq!(repository("a.io/x/y@sha256:abc"), "a.io/x/y");
        assert_eq!(repository("a.io/x/y:v1@sha256:abc"), "a.io/x/y");
    }

    #[test]
    fn the_go_builder_is_known_by_name_wherever_it_is_mirrored() {
        for i in [
            "ghcr.io/tenstorrent/tt-k8s-driver-manager-builder",
            "ghcr.io/tenstorrent/tt-k8s-driver-manager-builder:sha-abc1234",
            "registry.internal:5000/mirror/tt-k8s-driver-manager-builder@sha256:00",
        ] {
            assert!(is_go_builder(i), "{i}");
        }
        for i in [
            DEFAULT_AGENT_IMAGE,
            AGENT_REPOSITORY,
            "ghcr.io/tenstorrent/tt-k8s-driver-manager-builder-fork:1",
            "ghcr.io/tenstorrent/tt-k8s-driver-manager-builder/agent:1",
            "",
        ] {
            assert!(!is_go_builder(i), "{i}");
        }
        assert_eq!(repository(DEFAULT_AGENT_IMAGE), AGENT_REPOSITORY);
    }
}
