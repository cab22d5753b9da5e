// Package webhooktest makes TLS fixtures for tests of the webhook and its
// callers: a certificate authority, serving certificates it signs, and a
// folder where key pairs are written the way the kubelet updates a Secret
// volume. It is test support; only tests import it.
package webhooktest
