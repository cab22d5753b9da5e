package apiserver

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/client-go/util/keyutil"
)

// adminUser is the user name of the token in the token file; its group system:masters is
// allowed everything.
const adminUser = "gpuslice-admin"

// credentials are the files a server's folder keeps across restarts.
type credentials struct {
	// certDir is the kube-apiserver's --cert-dir: it writes a self-signed serving certificate
	// (apiserver.crt, leaf then CA) and key there on first start and reuses them later.
	certDir string
	// serviceAccountKey is an EC private key in PEM, for signing and verifying service account
	// tokens.
	serviceAccountKey string
	// tokenFile is the --token-auth-file: one line for the admin token.
	tokenFile string
	// token is the admin bearer token.
	token string
}

// loadOrCreateCredentials returns the credentials kept in dir, creating those that are missing.
func loadOrCreateCredentials(dir string) (credentials, error) {
	c := credentials{
		certDir:           filepath.Join(dir, "pki"),
		serviceAccountKey: filepath.Join(dir, "pki", "service-account.key"),
		tokenFile:         filepath.Join(dir, "pki", "tokens.csv"),
	}
	if err := os.MkdirAll(c.certDir, 0o700); err != nil {
		return c, fmt.Errorf("create certificate folder: %w", err)
	}

	if _, err := os.Stat(c.serviceAccountKey); errors.Is(err, fs.ErrNotExist) {
		key, err := keyutil.MakeEllipticPrivateKeyPEM()
		if err != nil {
			return c, fmt.Errorf("generate service account key: %w", err)
		}
		if err := os.WriteFile(c.serviceAccountKey, key, 0o600); err != nil {
			return c, fmt.Errorf("write service account key: %w", err)
		}
	} else if err != nil {
		return c, fmt.Errorf("service account key: %w", err)
	}

	line, err := os.ReadFile(c.tokenFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return c, fmt.Errorf("generate admin token: %w", err)
		}
		c.token = hex.EncodeToString(b)
		// token,user,uid,"group,..."
		content := fmt.Sprintf("%s,%s,%s,system:masters\n", c.token, adminUser, adminUser)
		if err := os.WriteFile(c.tokenFile, []byte(content), 0o600); err != nil { //nolint:gosec // G703: the path is under the test's own folder.
			return c, fmt.Errorf("write token file: %w", err)
		}
	case err != nil:
		return c, fmt.Errorf("read token file: %w", err)
	default:
		token, _, ok := strings.Cut(string(line), ",")
		if !ok || token == "" {
			return c, fmt.Errorf("token file %s: want token,user,uid,groups, got %q", c.tokenFile, line)
		}
		c.token = token
	}
	return c, nil
}
