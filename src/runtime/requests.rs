//! The controller's own count of its API requests, by verb and resource
//! (`ttdriver_api_requests_total`): a layer in the Kubernetes client's
//! service stack that names each request as the API server's audit log
//! would (`list nodes`, `patch nodes`, `create pods/eviction`, ...). A
//! watch is counted once, when it is opened. What a node cycle costs in
//! requests is read from it (the scale guard, `tests/cluster_scale_guard.rs`).

use std::sync::Arc;

use crate::metrics::Metrics;

/// A client over `config` whose every request is counted in `metrics`.
pub fn counted_client(config: kube::Config, metrics: Arc<Metrics>) -> kube::Result<kube::Client> {
    let layer = tower::layer::layer_fn(move |svc| {
        let m = metrics.clone();
        tower::util::MapRequest::new(svc, move |req: http::Request<kube::client::Body>| {
            let (verb, resource) = classify(req.method(), req.uri());
            m.inc_api_request(verb, &resource);
            req
        })
    });
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&layer)
        .build())
}

/// The audit log's verb and resource (`resource[/subresource]`) of a request.
pub fn classify(method: &http::Method, uri: &http::Uri) -> (&'static str, String) {
    let segs: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/... or /apis/<group>/<version>/...
    let rest: &[&str] = match segs.as_slice() {
        ["api", _, rest @ ..] => rest,
        ["apis", _, _, rest @ ..] => rest,
        _ => &[],
    };
    let rest = match rest {
        ["namespaces", _, more @ ..] if !more.is_empty() => more,
        r => r,
    };
    let resource = match rest {
        [] => "other".to_string(),
        [r] | [r, _] => (*r).to_string(),
        [r, _, sub, ..] => format!("{r}/{sub}"),
    };
    let named = rest.len() >= 2;
    let watch = uri
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    let verb = match *method {
        http::Method::GET if watch => "watch",
        http::Method::GET if named => "get",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE if named => "delete",
        http::Method::DELETE => "deletecollection",
        _ => "other",
    };
    (verb, resource)
}

#[cfg(test)]
mod tests {
    use super::classify;
    use http::Method;

    fn c(m: Method, uri: &str) -> (&'static str, String) {
        classify(&m, &uri.parse().expect("uri"))
    }

    #[test]
    fn requests_are_named_as_the_audit_log_names_them() {
        assert_eq!(
            c(Method::PATCH, "/api/v1/nodes/n1?fieldManager=x"),
            ("patch", "nodes".into())
        );
        assert_eq!(
            c(Method::GET, "/api/v1/nodes?watch=true&resourceVersion=1"),
            ("watch", "nodes".into())
        );
        assert_eq!(
            c(Method::GET, "/api/v1/nodes?limit=500"),
            ("list", "nodes".into())
        );
        assert_eq!(
            c(Method::POST, "/api/v1/namespaces/ml/pods/w/eviction"),
            ("create", "pods/eviction".into())
        );
        assert_eq!(
            c(Method::DELETE, "/api/v1/namespaces/tt/pods/p"),
            ("delete", "pods".into())
        );
        assert_eq!(
            c(Method::POST, "/api/v1/namespaces/tt/events"),
            ("create", "events".into())
        );
        assert_eq!(
            c(
                Method::PATCH,
                "/apis/tenstorrent.com/v1alpha1/tenstorrentdriverpolicies/p/status"
            ),
            ("patch", "tenstorrentdriverpolicies/status".into())
        );
        assert_eq!(
            c(
                Method::PATCH,
                "/apis/apps/v1/namespaces/tt/daemonsets/ttdrv-p?fieldManager=x"
            ),
            ("patch", "daemonsets".into())
        );
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces/tt"),
            ("get", "namespaces".into())
        );
        assert_eq!(c(Method::GET, "/version"), ("list", "other".into()));
    }
}
