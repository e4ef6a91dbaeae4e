//! Azure (cloud A): Azure OpenAI, where a deployment stands for the model in the path, and
//! Azure AI Foundry endpoints. Both speak OpenAI's shapes, so requests, answers and errors
//! pass as they do for OpenAI; only the place (host, path, `api-version`) and the key's
//! header (`api-key`) differ.

use super::openai::Passthrough;
use super::{
    host_label, missing_key, path_segment, Backend, Binding, Outbound, Provider, Signable, TargetFields, Translator,
    UpstreamRequest, Usage,
};
use crate::cloud::{AzureDeploymentType, CloudFields, Deployment};
use crate::errors::GatewayError;
use crate::request::endpoint::ClientApi;
use crate::request::endpoint::Endpoint;
use serde_json::Value;
use std::rc::Rc;

/// Azure OpenAI: `https://{resource_name}.openai.azure.com/openai/deployments/{deployment}/...`.
pub(crate) struct AzureOpenAi;

impl Provider for AzureOpenAi {
    fn bind(&self, name: &str, fields: TargetFields) -> Result<Binding, GatewayError> {
        let cloud = fields.cloud;
        let base_url = match &cloud.resource_name {
            Some(resource) => {
                Some(format!("https://{}.openai.azure.com/openai", host_label("resource_name", resource)?))
            }
            None if fields.custom_host => None,
            None => return Err(required("resource_name", "the Azure OpenAI resource (or custom_host)")),
        };
        let deployments = Deployments::of(cloud)?;
        let key = fields.api_key.map(str::to_string).ok_or_else(|| missing_key(name))?;
        Ok(Binding { base_url, account: Some(key.clone()), backend: Rc::new(AzureBackend { key, place: deployments }) })
    }

    fn serves_resources(&self) -> bool {
        true
    }
}

/// Azure AI Foundry (model inference endpoints): serverless
/// `https://{endpoint}.{region}.models.ai.azure.com`, managed
/// `https://{endpoint}.{region}.inference.ml.azure.com`, both with OpenAI's paths.
pub(crate) struct AzureAi;

impl Provider for AzureAi {
    fn bind(&self, name: &str, fields: TargetFields) -> Result<Binding, GatewayError> {
        let cloud = fields.cloud;
        let base_url = if fields.custom_host {
            None
        } else {
            // The endpoint's name; a serverless deployment is reached by its own name.
            let endpoint = cloud.azure_endpoint_name.as_ref().or(cloud.azure_deployment_name.as_ref());
            let endpoint = endpoint.ok_or_else(|| required("cloud_a_endpoint_name", "the endpoint's name"))?;
            let region = cloud.azure_region.as_ref().ok_or_else(|| required("cloud_a_region", "the region"))?;
            let kind = cloud
                .azure_deployment_type
                .ok_or_else(|| required("cloud_a_deployment_type", "`serverless` or `managed`"))?;
            let domain = match kind {
                AzureDeploymentType::Serverless => "models.ai.azure.com",
                AzureDeploymentType::Managed => "inference.ml.azure.com",
            };
            let endpoint = host_label("cloud_a_endpoint_name", endpoint)?;
            Some(format!("https://{endpoint}.{}.{domain}", host_label("cloud_a_region", region)?))
        };
        let key = fields.api_key.map(str::to_string).ok_or_else(|| missing_key(name))?;
        let place = Foundry {
            api_version: cloud.azure_api_version.clone(),
            // A managed endpoint routes to one of its deployments by this header.
            deployment: cloud
                .azure_deployment_name
                .clone()
                .filter(|_| cloud.azure_deployment_type == Some(AzureDeploymentType::Managed)),
        };
        Ok(Binding { base_url, account: Some(key.clone()), backend: Rc::new(AzureBackend { key, place }) })
    }

    fn serves_resources(&self) -> bool {
        true
    }
}

/// Where in the target a request goes: the path and query below the base URL, and headers.
trait Place {
    /// Whether the endpoint serves OpenAI's Responses API.
    fn speaks_responses(&self) -> bool;

    fn locate(
        &self,
        endpoint: Endpoint,
        model: Option<&str>,
        request: &mut UpstreamRequest,
    ) -> Result<(), GatewayError>;
}

/// An Azure target: its key goes as `api-key`.
struct AzureBackend<P> {
    key: String,
    place: P,
}

impl<P: Place + Clone + 'static> Backend for AzureBackend<P> {
    fn translator(&self) -> Box<dyn Translator> {
        Box::new(AzureTranslator { place: self.place.clone(), openai: Passthrough::COMPATIBLE })
    }

    fn authorize(&self, _: &Signable, _: &dyn Fn() -> u64) -> Result<Vec<(&'static str, String)>, GatewayError> {
        Ok(vec![("api-key", self.key.clone())])
    }
}

/// OpenAI's translation (answers, streams and errors are OpenAI-shaped) at Azure's place.
struct AzureTranslator<P> {
    place: P,
    /// Azure serves OpenAI's API: its answers pass as OpenAI's do.
    openai: Passthrough,
}

impl<P: Place> Translator for AzureTranslator<P> {
    fn request(&mut self, outbound: Outbound) -> Result<UpstreamRequest, GatewayError> {
        let endpoint = outbound.endpoint;
        let model = outbound.body.as_ref().and_then(|b| b.get("model")).and_then(Value::as_str).map(str::to_string);
        let mut request = self.openai.request(outbound)?;
        self.place.locate(endpoint, model.as_deref(), &mut request)?;
        Ok(request)
    }

    fn translates_responses(&self) -> bool {
        self.openai.translates_responses()
    }

    fn response(&mut self, body: &[u8]) -> Result<Vec<u8>, GatewayError> {
        self.openai.response(body)
    }

    fn stream(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        self.openai.stream(chunk, out)
    }

    fn stream_end(&mut self, out: &mut Vec<u8>) {
        self.openai.stream_end(out)
    }

    fn error(&self, status: u16, headers: &[(String, Vec<u8>)], body: &[u8]) -> Vec<u8> {
        self.openai.error(status, headers, body)
    }

    fn usage(&self) -> Option<Usage> {
        self.openai.usage()
    }

    fn speaks(&self, api: ClientApi, _model: &str) -> bool {
        api == ClientApi::Responses && self.place.speaks_responses()
    }
}

/// Azure OpenAI's deployments: one fixed, or a list chosen by the request's model.
#[derive(Clone)]
enum Deployments {
    Fixed { deployment_id: String, api_version: String },
    ByAlias(Vec<Deployment>),
}

impl Deployments {
    fn of(cloud: &CloudFields) -> Result<Deployments, GatewayError> {
        if cloud.deployments.is_empty() {
            let deployment_id = cloud
                .deployment_id
                .as_deref()
                .ok_or_else(|| required("deployment_id", "the Azure OpenAI deployment (or `deployments`)"))?;
            let deployment_id = path_segment("deployment_id", deployment_id)?.to_string();
            let api_version =
                cloud.api_version.clone().ok_or_else(|| required("api_version", "Azure's API version"))?;
            return Ok(Deployments::Fixed { deployment_id, api_version });
        }
        if cloud.deployments.iter().filter(|d| d.is_default).count() > 1 {
            return Err(GatewayError::invalid_param("deployments", "at most one deployment may be `is_default`")
                .with_code("invalid_config"));
        }
        for (i, deployment) in cloud.deployments.iter().enumerate() {
            path_segment(&format!("deployments[{i}].deployment_id"), &deployment.deployment_id)?;
        }
        Ok(Deployments::ByAlias(cloud.deployments.clone()))
    }

    /// The deployment id and API version for a request for `model` (none: the default).
    fn choose(&self, model: Option<&str>) -> Result<(&str, &str), GatewayError> {
        match self {
            Deployments::Fixed { deployment_id, api_version } => Ok((deployment_id, api_version)),
            Deployments::ByAlias(list) => {
                let by_alias = model.and_then(|m| list.iter().find(|d| d.alias == m));
                let chosen = by_alias.or_else(|| list.iter().find(|d| d.is_default)).ok_or_else(|| {
                    let aliases: Vec<&str> = list.iter().map(|d| d.alias.as_str()).collect();
                    GatewayError::invalid_param(
                        "deployments",
                        format!(
                            "no deployment has the alias '{}' and none is `is_default`; aliases: {}",
                            model.unwrap_or_default(),
                            aliases.join(", ")
                        ),
                    )
                    .with_code("invalid_config")
                })?;
                Ok((&chosen.deployment_id, &chosen.api_version))
            }
        }
    }
}

impl Place for Deployments {
    fn speaks_responses(&self) -> bool {
        true
    }

    fn locate(
        &self,
        endpoint: Endpoint,
        model: Option<&str>,
        request: &mut UpstreamRequest,
    ) -> Result<(), GatewayError> {
        let (deployment, api_version) = self.choose(model)?;
        // Inference endpoints live under their deployment; files, batches, responses (the
        // deployment is their `model`) and the other resources under the resource itself.
        if !matches!(endpoint, Endpoint::Resource | Endpoint::Responses | Endpoint::StoredResponse) {
            request.path = format!("/deployments/{deployment}{}", request.path);
        }
        request.query = Some(format!("api-version={}", crate::percent::encode(api_version)));
        Ok(())
    }
}

/// An Azure AI Foundry endpoint.
#[derive(Clone)]
struct Foundry {
    api_version: Option<String>,
    deployment: Option<String>,
}

impl Place for Foundry {
    fn speaks_responses(&self) -> bool {
        false
    }

    fn locate(&self, _: Endpoint, _: Option<&str>, request: &mut UpstreamRequest) -> Result<(), GatewayError> {
        request.query = self.api_version.as_deref().map(|v| format!("api-version={}", crate::percent::encode(v)));
        if let Some(deployment) = &self.deployment {
            request.headers.push(("azureml-model-deployment", deployment.clone()));
        }
        Ok(())
    }
}

fn required(field: &str, what: &str) -> GatewayError {
    GatewayError::invalid_param(field, format!("`{field}` is required: {what}")).with_code("invalid_config")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::{bind_and_prepare, Prepared};
    use crate::unit_tests::test;
    use serde_json::json;
    use std::borrow::Cow;

    fn outbound(endpoint: Endpoint, path: &str, body: Option<Value>) -> Outbound<'_> {
        Outbound {
            endpoint,
            path,
            body: body.map(Cow::Owned),
            overridden: false,
            strict_vendor_compliance: true,
            now_ms: &|| 0,
            organization: None,
            project: None,
            beta: None,
            headers: &[],
        }
    }

    fn deployment(id: &str, alias: &str, is_default: bool) -> Deployment {
        Deployment { deployment_id: id.into(), alias: alias.into(), api_version: "2024-10-21".into(), is_default }
    }

    fn send(
        provider: &str,
        cloud: &CloudFields,
        custom_host: Option<&str>,
        endpoint: Endpoint,
        path: &str,
        body: Option<Value>,
    ) -> Result<Prepared, GatewayError> {
        let fields =
            TargetFields { api_key: Some("az-key"), custom_host: custom_host.is_some(), built_in: None, cloud };
        bind_and_prepare(provider, fields, custom_host, "POST", outbound(endpoint, path, body))
    }

    #[test]
    fn azure_openai_sends_to_the_deployment_with_the_api_version_and_api_key() {
        let cloud = CloudFields {
            resource_name: Some("contoso".into()),
            deployment_id: Some("gpt4o-prod".into()),
            api_version: Some("2024-10-21".into()),
            ..CloudFields::default()
        };
        let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]});
        let prepared = send("azure-openai", &cloud, None, Endpoint::ChatCompletions, "/chat/completions", Some(body));
        let prepared = prepared.unwrap();
        assert_eq!(prepared.path, "/openai/deployments/gpt4o-prod/chat/completions?api-version=2024-10-21");
        assert_eq!(prepared.request.headers, vec![("api-key", "az-key".to_string())]);
        assert_eq!(prepared.request.body, None, "the client's bytes go as they came");
        // Files and batches live under the resource, not a deployment.
        let files = send("azure-openai", &cloud, None, Endpoint::Resource, "/files", None).unwrap();
        assert_eq!(files.path, "/openai/files?api-version=2024-10-21");
    }

    #[test]
    fn deployments_are_chosen_by_alias_else_the_default() {
        let cloud = CloudFields {
            deployments: vec![deployment("d-big", "gpt-4o", false), deployment("d-mini", "gpt-4o-mini", true)],
            ..CloudFields::default()
        };
        let host = Some("http://127.0.0.1:9000/openai");
        let chat = |model: &str| {
            let body = json!({"model": model, "messages": [{"role": "user", "content": "Hi"}]});
            send("azure-openai", &cloud, host, Endpoint::ChatCompletions, "/chat/completions", Some(body))
                .map(|p| p.path)
        };
        assert_eq!(chat("gpt-4o").unwrap(), "/openai/deployments/d-big/chat/completions?api-version=2024-10-21");
        assert_eq!(chat("other").unwrap(), "/openai/deployments/d-mini/chat/completions?api-version=2024-10-21");
        let no_default = CloudFields { deployments: vec![deployment("d-big", "gpt-4o", false)], ..cloud.clone() };
        let body = json!({"model": "other", "messages": [{"role": "user", "content": "Hi"}]});
        let err = send("azure-openai", &no_default, host, Endpoint::ChatCompletions, "/chat/completions", Some(body));
        let err = err.err().unwrap();
        assert_eq!((err.status, err.param.as_deref()), (400, Some("deployments")));
    }

    #[test]
    fn configs_that_cannot_work_are_400s_naming_the_field() {
        let param = |cloud: CloudFields, provider: &str| {
            let fields = TargetFields { api_key: Some("k"), custom_host: false, built_in: None, cloud: &cloud };
            let spec = crate::providers::find(provider).unwrap();
            spec.kind.bind(provider, fields).err().map(|e| (e.status, e.param.unwrap_or_default()))
        };
        let two_defaults = CloudFields {
            resource_name: Some("r".into()),
            deployments: vec![deployment("a", "x", true), deployment("b", "y", true)],
            ..CloudFields::default()
        };
        assert_eq!(param(two_defaults, "azure-openai"), Some((400, "deployments".into())));
        assert_eq!(param(CloudFields::default(), "azure-openai"), Some((400, "resource_name".into())));
        let no_deployment = CloudFields { resource_name: Some("r".into()), ..CloudFields::default() };
        assert_eq!(param(no_deployment, "azure-openai"), Some((400, "deployment_id".into())));
        let escaping = CloudFields {
            resource_name: Some("evil.com/x".into()),
            deployment_id: Some("d".into()),
            api_version: Some("v".into()),
            ..CloudFields::default()
        };
        assert_eq!(param(escaping, "azure-openai"), Some((400, "resource_name".into())));
        let climbing = CloudFields {
            resource_name: Some("r".into()),
            deployment_id: Some("..".into()),
            api_version: Some("v".into()),
            ..CloudFields::default()
        };
        assert_eq!(param(climbing, "azure-openai"), Some((400, "deployment_id".into())));
        assert_eq!(param(CloudFields::default(), "azure-ai"), Some((400, "cloud_a_endpoint_name".into())));
        let keyless = CloudFields {
            resource_name: Some("r".into()),
            deployment_id: Some("d".into()),
            api_version: Some("v".into()),
            ..CloudFields::default()
        };
        let fields = TargetFields { api_key: None, custom_host: false, built_in: None, cloud: &keyless };
        assert_eq!(AzureOpenAi.bind("azure-openai", fields).err().map(|e| e.status), Some(401));
    }

    #[test]
    fn azure_ai_builds_its_host_from_the_endpoint_region_and_kind() {
        let managed = CloudFields {
            azure_endpoint_name: Some("my-ep".into()),
            azure_region: Some("eastus2".into()),
            azure_deployment_type: Some(AzureDeploymentType::Managed),
            azure_deployment_name: Some("llama-blue".into()),
            azure_api_version: Some("2024-05-01-preview".into()),
            ..CloudFields::default()
        };
        let fields = TargetFields { api_key: Some("k"), custom_host: false, built_in: None, cloud: &managed };
        let binding = AzureAi.bind("azure-ai", fields).unwrap();
        assert_eq!(binding.base_url.as_deref(), Some("https://my-ep.eastus2.inference.ml.azure.com"));
        let body = json!({"model": "llama", "messages": [{"role": "user", "content": "Hi"}]});
        let prepared = send("azure-ai", &managed, None, Endpoint::ChatCompletions, "/chat/completions", Some(body));
        let prepared = prepared.unwrap();
        assert_eq!(prepared.path, "/chat/completions?api-version=2024-05-01-preview");
        let expected = vec![("azureml-model-deployment", "llama-blue".to_string()), ("api-key", "az-key".to_string())];
        assert_eq!(prepared.request.headers, expected);
        let serverless = CloudFields {
            azure_deployment_type: Some(AzureDeploymentType::Serverless),
            azure_endpoint_name: None,
            ..managed
        };
        let fields = TargetFields { api_key: Some("k"), custom_host: false, built_in: None, cloud: &serverless };
        let binding = AzureAi.bind("azure-ai", fields).unwrap();
        assert_eq!(binding.base_url.as_deref(), Some("https://llama-blue.eastus2.models.ai.azure.com"));
    }
}
