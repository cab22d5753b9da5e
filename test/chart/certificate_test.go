package chart

import (
	"strings"
	"testing"
)

// TestWebhookCertificateWithoutCluster renders the chart as a GitOps tool does, with helm
// template and no cluster to read: with the defaults a certificate made there would change on
// every render, so the render fails and names both fixes; with webhook.tls set, two renders are
// equal byte for byte, certificate included.
func TestWebhookCertificateWithoutCluster(t *testing.T) {
	h := requireHelm(t)
	_, err := h.templateWith()
	if err == nil {
		t.Fatal("helm template with the defaults and no cluster: rendered; want a failure naming the fix (a generated certificate changes on every render)")
	}
	for _, want := range []string{"webhook certificate: this render cannot read the cluster", "webhook.certManager.enabled=true", "webhook.tls.caCert, webhook.tls.cert and webhook.tls.key"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("helm template error lacks %q:\n%v", want, err)
		}
	}
	first, err := h.templateWith(webhookTLSValues)
	if err != nil {
		t.Fatal(err)
	}
	second, err := h.templateWith(webhookTLSValues)
	if err != nil {
		t.Fatal(err)
	}
	if string(first) != string(second) {
		t.Error("two renders with webhook.tls differ; want them equal")
	}
	if !strings.Contains(string(first), "caBundle: LS0t") {
		t.Error("the render with webhook.tls has no caBundle from it")
	}
}
