// /docs: starts Scalar (static/vendor/) on the OpenAPI document. Loaded before Scalar's bundle,
// so that its settings are in place when the bundle runs; the CSP allows no inline script.
(function () {
  "use strict";

  // zod (inside Scalar) probes `Function("")` to pick a faster parser; under a CSP without
  // 'unsafe-eval' that probe is a reported violation. jitless: no probe, same results.
  globalThis.__zod_globalConfig = Object.assign(globalThis.__zod_globalConfig || {}, {
    jitless: true,
  });

  // The document's curl commands use $BRAND for the brand's id; opened from the dashboard, the
  // page knows it. Its path parameters get it as their example, for Scalar's own snippets and
  // request console.
  function fillInBrand(document_, brandId) {
    Object.values(document_.paths || {}).forEach(function (item) {
      Object.values(item).forEach(function (operation) {
        (operation.parameters || []).forEach(function (parameter) {
          if (parameter.in === "path" && parameter.name === "brandId") {
            parameter.schema = Object.assign({}, parameter.schema, { example: brandId });
          }
        });
        (operation["x-codeSamples"] || []).forEach(function (sample) {
          sample.source = sample.source.replace(/\$BRAND\b/g, brandId);
        });
      });
    });
    return document_;
  }

  function showProblem(mount, text) {
    var problem = document.createElement("p");
    problem.className = "docs-fallback";
    problem.setAttribute("role", "alert");
    problem.textContent = text + " The document itself: ";
    var link = document.createElement("a");
    link.href = mount.dataset.openapiUrl;
    link.textContent = mount.dataset.openapiUrl;
    problem.appendChild(link);
    mount.replaceChildren(problem);
  }

  function start() {
    var mount = document.getElementById("reference");
    if (!mount) return;
    if (!window.Scalar) {
      showProblem(mount, "The API reference's script did not load.");
      return;
    }
    fetch(mount.dataset.openapiUrl, { headers: { Accept: "application/json" } })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.json();
      })
      .then(function (document_) {
        var brandId = mount.dataset.brandId;
        var app = document.createElement("div");
        mount.replaceChildren(app);
        window.Scalar.createApiReference(app, {
          content: brandId ? fillInBrand(document_, brandId) : document_,
          // Nothing leaves for Scalar's services: no fonts, telemetry, AI agent or MCP, and
          // the request console calls this API directly (it is the same site).
          withDefaultFonts: false,
          telemetry: false,
          agent: { disabled: true },
          mcp: { disabled: true },
          showDeveloperTools: "never",
          // Its hosted client would be sent this page's address: the request console in the
          // page ("Test Request") stays.
          hideClientButton: true,
          documentDownloadType: "json",
        });
      })
      .catch(function (error) {
        showProblem(mount, "The OpenAPI document could not be loaded (" + error.message + ").");
      });
  }

  document.addEventListener("DOMContentLoaded", start);
})();
