// An OTLP/HTTP trace receiver for tests/apps/otlp_traces_test.py: decodes every POST /v1/traces
// body (application/x-protobuf) with OpenTelemetry JS's ExportTraceServiceRequest, generated from
// opentelemetry-proto (npm @opentelemetry/otlp-transformer, pinned by package-lock.json), and
// appends one JSON line per span to OUT_FILE. A body that does not decode is answered 400 and
// logged as {"decode_error": ...}. Usage: node receiver.cjs PORT OUT_FILE
"use strict";
const fs = require("fs");
const http = require("http");
const root = require("@opentelemetry/otlp-transformer/build/src/generated/root");

const Request = root.opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest;
const Response = root.opentelemetry.proto.collector.trace.v1.ExportTraceServiceResponse;
const [port, outFile] = process.argv.slice(2);
const hex = (b) => Buffer.from(b || []).toString("hex");

function attrs(list) {
  const out = {};
  for (const kv of list || []) {
    const v = kv.value || {};
    out[kv.key] = v.stringValue ?? v.intValue ?? v.doubleValue ?? v.boolValue ?? null;
  }
  return out;
}

http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    if (req.method !== "POST" || req.url !== "/v1/traces" ||
        req.headers["content-type"] !== "application/x-protobuf") {
      fs.appendFileSync(outFile, JSON.stringify({decode_error: "unexpected request " +
        req.method + " " + req.url + " " + req.headers["content-type"]}) + "\n");
      res.writeHead(400).end();
      return;
    }
    let msg;
    try {
      msg = Request.toObject(Request.decode(Buffer.concat(chunks)), {longs: String});
    } catch (e) {
      fs.appendFileSync(outFile, JSON.stringify({decode_error: String(e)}) + "\n");
      res.writeHead(400).end();
      return;
    }
    const lines = [];
    for (const rs of msg.resourceSpans || []) {
      const resource = attrs((rs.resource || {}).attributes);
      for (const ss of rs.scopeSpans || []) {
        for (const s of ss.spans || []) {
          lines.push(JSON.stringify({
            resource, scope: (ss.scope || {}).name, traceId: hex(s.traceId), spanId: hex(s.spanId),
            parentSpanId: hex(s.parentSpanId), name: s.name, kind: s.kind,
            start: s.startTimeUnixNano, end: s.endTimeUnixNano, attributes: attrs(s.attributes),
            status: s.status || null}));
        }
      }
    }
    if (lines.length) fs.appendFileSync(outFile, lines.join("\n") + "\n");
    res.writeHead(200, {"content-type": "application/x-protobuf"});
    res.end(Buffer.from(Response.encode(Response.create({})).finish()));
  });
}).listen(Number(port), "127.0.0.1", () => console.log("otlp receiver on " + port));
