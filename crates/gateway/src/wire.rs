//! The API's types on both sides of the gateway. A client's body is read into its
//! `api_types` request (a bad one is the client's 400, naming the field); a node's answer
//! into its `api_types` response (a bad one is the node's fault: 502, naming the node and
//! the field). Nothing is taken by default where a node left a field out.
//!
//! The response types do not refuse fields they do not know, so a node newer than the
//! gateway still answers in a shape it reads; the request types do, as the daemon's own
//! handlers do.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use crate::error;
use crate::node::parse;

/// A client's body that is not the API's request type: the field and what is wrong.
#[derive(Debug)]
pub(crate) struct BadBody {
    field: String,
    detail: String,
}

impl IntoResponse for BadBody {
    fn into_response(self) -> Response {
        error(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            format!("Invalid JSON body: field {}: {}", self.field, self.detail),
        )
    }
}

/// A client's request body (an empty one is `{}`) read as `T`.
pub(crate) fn client_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, BadBody> {
    let bytes = if bytes.is_empty() { b"{}" } else { bytes };
    parse(bytes).map_err(|(field, detail)| BadBody { field, detail })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::NodeError;
    use api_types::{CreateSandbox, ForkRequest, ForkResult, Snapshot};
    use axum::http::Method;
    use http_body_util::BodyExt;

    const SNAPSHOT: &str = r#"{"id":"snap-1","type":"memory","source_sandbox_id":"sb-1",
        "image":"python","size_bytes":1,"created_at":"2025-01-01T00:00:00Z","cpus":1.0,
        "memory_mb":2048,"disk_mb":0,"labels":{}}"#;

    /// A node on loopback that answers every request with `status` and `body`.
    async fn node(body: &'static str) -> String {
        let app = axum::Router::new()
            .fallback(move || async move { crate::node::respond(StatusCode::OK, body.into()) });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    async fn ask<T: DeserializeOwned>(api: &str) -> Result<T, NodeError> {
        let links = crate::node::Links::new(None, false);
        links.admit(api, "n1").await.unwrap();
        links
            .call::<T>(api, Method::GET, "/v1/snapshots/snap-1", "t")
            .await
    }

    #[tokio::test]
    async fn an_ill_typed_node_answer_is_a_502_naming_the_node_and_the_field() {
        let ill = SNAPSHOT.replace("2048", "\"lots\"");
        let api = node(Box::leak(ill.into_boxed_str())).await;
        let e = ask::<Snapshot>(&api).await.unwrap_err();
        let NodeError::Answer { field, what, .. } = &e else {
            panic!("{e:?}");
        };
        assert_eq!((field.as_str(), *what), ("memory_mb", "Snapshot"));
        let text = e.to_string();
        assert!(text.contains(&api) && text.contains("memory_mb"), "{text}");
        let resp = crate::node_error(e);
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let body: api_types::ErrorBody = serde_json::from_slice(&body).unwrap();
        assert!(body.message.contains("memory_mb"), "{}", body.message);
    }

    #[tokio::test]
    async fn a_missing_field_is_named_and_never_defaulted() {
        let without = SNAPSHOT.replace("\"memory_mb\":2048,", "");
        let api = node(Box::leak(without.into_boxed_str())).await;
        let e = ask::<Snapshot>(&api).await.unwrap_err();
        assert!(
            matches!(&e, NodeError::Answer { field, .. } if field == "memory_mb"),
            "{e:?}"
        );
        let api = node(r#"{"snapshot_id":"snap-1","children":[{"index":"0"}]}"#).await;
        let e = ask::<ForkResult>(&api).await.unwrap_err();
        assert!(
            matches!(&e, NodeError::Answer { field, .. } if field == "children[0].index"),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn a_newer_nodes_extra_fields_are_read_past() {
        let newer = SNAPSHOT.replace("\"labels\":{}", "\"labels\":{},\"tier\":\"hot\"");
        let api = node(Box::leak(newer.into_boxed_str())).await;
        let s = ask::<Snapshot>(&api).await.unwrap();
        assert_eq!(s.memory_mb, 2048);
    }

    #[test]
    fn a_bad_client_body_is_a_400_naming_the_field() {
        for (body, named) in [
            (r#"{"count":"3"}"#, "field count"),
            (
                r#"{"count":3,"per_child":[{"env":{"A":1}}]}"#,
                "per_child[0].env.A",
            ),
            (r#"{"count":3,"colour":"red"}"#, "field colour"),
            (r#"{}"#, "field count"),
        ] {
            let resp = client_body::<ForkRequest>(body.as_bytes())
                .unwrap_err()
                .into_response();
            assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{body}");
            let msg = futures::executor::block_on(resp.into_body().collect())
                .unwrap()
                .to_bytes();
            let msg = String::from_utf8_lossy(&msg);
            assert!(msg.contains(named), "{body}: {msg}");
        }
        let create: CreateSandbox = client_body(b"").unwrap();
        assert_eq!(create, CreateSandbox::default());
    }
}
