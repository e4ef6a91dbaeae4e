//! The `google` (Gemini API) and `vertex-ai` providers: where a target's requests go and how
//! they authenticate. The Gemini API takes an API key in `x-goog-api-key`; Vertex AI takes an
//! access token, either the client's own or one exchanged for the config's service account.

use super::auth;
use super::{vertex_translator, GeminiTranslator, GeminiTransport, VertexLocation};
use crate::errors::GatewayError;
use crate::providers::{
    bind_keyed, host_label, missing_key, Backend, Binding, KeyHeader, Provider, Signable, TargetFields, TokenRequest,
    TokenSource, Translator,
};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::rc::Rc;

pub(crate) struct Gemini;

impl Provider for Gemini {
    fn bind(&self, name: &str, fields: TargetFields) -> Result<Binding, GatewayError> {
        bind_keyed(name, fields, KeyHeader::Named("x-goog-api-key"), || {
            Box::new(GeminiTranslator::new(GeminiTransport::GeminiApi))
        })
    }
}

pub(crate) struct VertexAi;

impl Provider for VertexAi {
    fn bind(&self, name: &str, fields: TargetFields) -> Result<Binding, GatewayError> {
        let cloud = fields.cloud;
        let region = cloud.gcp_region.clone().ok_or_else(|| required("cloud_b_region"))?;
        let service_account = cloud.gcp_service_account_json.as_ref();
        // A key file names its project; the config's wins.
        let project = cloud
            .gcp_project_id
            .clone()
            .or_else(|| service_account.and_then(|sa| sa.get("project_id")).and_then(Value::as_str).map(str::to_string))
            .ok_or_else(|| required("cloud_b_project_id"))?;
        let base_url = match region.as_str() {
            _ if fields.custom_host => None,
            "global" => Some("https://aiplatform.googleapis.com".to_string()),
            region => Some(format!("https://{}-aiplatform.googleapis.com", host_label("cloud_b_region", region)?)),
        };
        // The config's service account wins over the client's Authorization header, whose
        // Bearer is otherwise the access token itself.
        let credential = match service_account {
            Some(key_file) => Credential::ServiceAccount(ServiceAccount::new(key_file)?),
            None => Credential::Token(fields.api_key.map(str::to_string).ok_or_else(|| missing_key(name))?),
        };
        let account = Some(match &credential {
            Credential::ServiceAccount(sa) => sa.cache_key.clone(),
            Credential::Token(token) => token.clone(),
        });
        let location = VertexLocation { project, region };
        let request_type = cloud.gcp_request_type.clone();
        Ok(Binding { base_url, account, backend: Rc::new(Vertex { location, credential, request_type }) })
    }
}

fn required(field: &str) -> GatewayError {
    GatewayError::invalid_param(field, format!("`{field}` is required for vertex-ai")).with_code("invalid_config")
}

struct Vertex {
    location: VertexLocation,
    credential: Credential,
    /// `X-Cloud-B-LLM-Request-Type`, sent as `X-Vertex-AI-LLM-Request-Type`.
    request_type: Option<String>,
}

enum Credential {
    /// The client's own access token, sent unchanged.
    Token(String),
    ServiceAccount(ServiceAccount),
}

impl Backend for Vertex {
    fn translator(&self) -> Box<dyn Translator> {
        vertex_translator(self.location.clone())
    }

    fn authorize(&self, request: &Signable, _: &dyn Fn() -> u64) -> Result<Vec<(&'static str, String)>, GatewayError> {
        let token = match &self.credential {
            Credential::Token(token) => token.as_str(),
            // The exchange fetched it before this request was prepared.
            Credential::ServiceAccount(_) => request.token.ok_or_else(|| {
                GatewayError::new(502, "api_error", "no access token for the service account")
                    .with_code("token_exchange_failed")
            })?,
        };
        let mut headers = vec![("authorization", format!("Bearer {token}"))];
        if let Some(kind) = &self.request_type {
            headers.push(("x-vertex-ai-llm-request-type", kind.clone()));
        }
        Ok(headers)
    }

    fn token_source(&self) -> Option<&dyn TokenSource> {
        match &self.credential {
            Credential::ServiceAccount(sa) => Some(sa),
            Credential::Token(_) => None,
        }
    }
}

/// A service account key file: exchanged for an access token at its `token_uri`.
struct ServiceAccount {
    key_file: Map<String, Value>,
    /// SHA-256 over the whole key file: only the same key finds a cached token.
    cache_key: String,
}

impl ServiceAccount {
    fn new(key_file: &Map<String, Value>) -> Result<ServiceAccount, GatewayError> {
        // Checked now, so a key file that cannot work is a 400 before any call.
        auth::token_uri(key_file)?;
        let digest = Sha256::digest(serde_json::to_vec(key_file).unwrap_or_default());
        let cache_key = digest.iter().map(|b| format!("{b:02x}")).collect();
        Ok(ServiceAccount { key_file: key_file.clone(), cache_key })
    }
}

impl TokenSource for ServiceAccount {
    fn cache_key(&self) -> &str {
        &self.cache_key
    }

    fn request(&self, now_ms: u64) -> Result<TokenRequest, GatewayError> {
        auth::token_request(&self.key_file, now_ms / 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::CloudFields;
    use crate::unit_tests::test;
    use serde_json::json;

    fn bind(cloud: &CloudFields, api_key: Option<&str>) -> Result<Binding, GatewayError> {
        VertexAi.bind("vertex-ai", TargetFields { api_key, custom_host: false, built_in: None, cloud })
    }

    #[test]
    fn vertex_hosts_come_from_the_region() {
        let regional = CloudFields {
            gcp_region: Some("europe-west4".into()),
            gcp_project_id: Some("p".into()),
            ..CloudFields::default()
        };
        let url = |cloud: &CloudFields| bind(cloud, Some("ya29.t")).unwrap().base_url;
        assert_eq!(url(&regional).as_deref(), Some("https://europe-west4-aiplatform.googleapis.com"));
        let global = CloudFields { gcp_region: Some("global".into()), ..regional.clone() };
        assert_eq!(url(&global).as_deref(), Some("https://aiplatform.googleapis.com"));
        let hostile = CloudFields { gcp_region: Some("evil.com/".into()), ..regional };
        assert_eq!(bind(&hostile, Some("t")).err().and_then(|e| e.param).as_deref(), Some("cloud_b_region"));
    }

    #[test]
    fn configs_that_cannot_work_are_400s_naming_the_field() {
        let param = |cloud: CloudFields, key: Option<&str>| bind(&cloud, key).err().map(|e| (e.status, e.param));
        let region = |r: &str| CloudFields { gcp_region: Some(r.into()), ..CloudFields::default() };
        assert_eq!(param(CloudFields::default(), Some("t")), Some((400, Some("cloud_b_region".into()))));
        assert_eq!(param(region("us-east1"), Some("t")), Some((400, Some("cloud_b_project_id".into()))));
        let keyless = CloudFields { gcp_project_id: Some("p".into()), ..region("us-east1") };
        assert_eq!(param(keyless, None).map(|(status, _)| status), Some(401));
        // A key file gives its project; one without a token_uri cannot be exchanged.
        let key_file = json!({"project_id": "from-key", "client_email": "a@b"}).as_object().cloned();
        let broken = CloudFields { gcp_service_account_json: key_file, ..region("us-east1") };
        let expected = Some((400, Some("cloud_b_service_account_json.token_uri".into())));
        assert_eq!(param(broken, None), expected);
    }
}
