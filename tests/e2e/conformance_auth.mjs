// Preloaded (`node --import`) into the MCP conformance suite when it tests the gateway: the suite
// has no option for a header, so this adds the gateway key to each of its requests to the gateway,
// by each of the three ways the suite sends one: fetch, the undici package's request (both through
// undici's global dispatcher) and node:http (the scenarios that send raw headers).
// CONFORMANCE_GATEWAY_ORIGIN names the gateway, CONFORMANCE_GATEWAY_AUTHORIZATION the header's value.
import http from "node:http";
import { createRequire } from "node:module";

const origin = new URL(process.env.CONFORMANCE_GATEWAY_ORIGIN);
const authorization = process.env.CONFORMANCE_GATEWAY_AUTHORIZATION;

const toGateway = (hostname, port) =>
  hostname === origin.hostname && String(port) === origin.port;

// undici's headers come as an object, a flat [name, value, ...] array, or [name, value] pairs.
function withAuthorization(headers) {
  if (headers == null) {
    return { authorization };
  }
  if (Array.isArray(headers)) {
    const pairs = Array.isArray(headers[0]) ? headers : [];
    if (!Array.isArray(headers[0])) {
      for (let i = 0; i + 1 < headers.length; i += 2) pairs.push([headers[i], headers[i + 1]]);
    }
    if (pairs.some(([name]) => String(name).toLowerCase() === "authorization")) return headers;
    return [...pairs.flat(), "authorization", authorization];
  }
  const entries = Object.entries(headers);
  if (entries.some(([name]) => name.toLowerCase() === "authorization")) return headers;
  return { ...headers, authorization };
}

// The suite's own undici (resolved from its script) sets the dispatcher fetch and request share.
const { Agent, setGlobalDispatcher } = createRequire(process.argv[1])("undici");
setGlobalDispatcher(new Agent().compose((dispatch) => (options, handler) => {
  const target = new URL(String(options.origin));
  const port = target.port || (target.protocol === "https:" ? "443" : "80");
  const authorized = toGateway(target.hostname, port) ? { ...options, headers: withAuthorization(options.headers) } : options;
  return dispatch(authorized, handler);
}));

const request = http.request;
http.request = function requestWithGatewayKey(...args) {
  const req = request.apply(this, args);
  const [first] = args;
  const target = typeof first === "string" || first instanceof URL ? new URL(first) : first ?? {};
  const hostname = target.hostname ?? String(target.host ?? "").split(":")[0];
  if (toGateway(hostname, target.port ?? 80) && !req.hasHeader("authorization")) {
    req.setHeader("authorization", authorization);
  }
  return req;
};
