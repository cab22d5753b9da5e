package webhook

import (
	"errors"

	"github.com/gpuslice/gpuslice/internal/configfile"
	"github.com/gpuslice/gpuslice/vgpu"
)

// DefaultAddress is the default ServerConfig.Address: every interface, the
// port webhook Services conventionally target.
const DefaultAddress = ":9443"

// ServerConfig is the configuration of the webhook binary: where it serves
// and with which certificate, plus the decision Config, whose fields it
// holds inline (a config file lists schedulerName and excludedNamespaces
// beside address). Call Validate before use; NewServer calls it too.
type ServerConfig struct {
	Config `json:",inline"`
	// Address is the host:port the HTTPS server listens on. An empty host
	// means every interface; the port must be from 1 to 65535.
	Address string `json:"address"`
	// TLSCertFile is the PEM serving certificate (the leaf, then any
	// intermediates), e.g. tls.crt of a kubernetes.io/tls Secret volume.
	// Required. Read again whenever it changes; see Server.
	TLSCertFile string `json:"tlsCertFile"`
	// TLSKeyFile is the PEM private key of TLSCertFile. Required.
	TLSKeyFile string `json:"tlsKeyFile"`
}

// DefaultServerConfig returns the configuration used when nothing is set:
// DefaultConfig, DefaultAddress and no certificate (which Validate rejects:
// the certificate files must be named).
func DefaultServerConfig() ServerConfig {
	return ServerConfig{Config: DefaultConfig(), Address: DefaultAddress}
}

// Validate checks every field, the decision Config's included, and returns
// every problem at once (errors.Join of *vgpu.FieldError), or nil. It does
// not read the certificate files: NewServer does.
func (c ServerConfig) Validate() error {
	var errs []error
	if err := c.Config.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := validateAddress(c.Address); err != nil {
		errs = append(errs, err)
	}
	if c.TLSCertFile == "" {
		errs = append(errs, vgpu.InvalidField("tlsCertFile", "", "required: the PEM serving certificate, e.g. tls.crt of a kubernetes.io/tls Secret volume"))
	}
	if c.TLSKeyFile == "" {
		errs = append(errs, vgpu.InvalidField("tlsKeyFile", "", "required: the PEM private key of tlsCertFile, e.g. tls.key of a kubernetes.io/tls Secret volume"))
	}
	return errors.Join(errs...)
}

// validateAddress returns a *vgpu.FieldError unless addr is host:port with
// a port from 1 to 65535.
func validateAddress(addr string) error {
	const allowed = "must be host:port with a port from 1 to 65535, e.g. " + DefaultAddress + " (every interface) or 127.0.0.1:9443"
	if port, ok := configfile.Port(addr); !ok || port < 1 {
		return vgpu.InvalidField("address", addr, allowed)
	}
	return nil
}

// LoadServerConfigFile reads a YAML or JSON file of ServerConfig fields over
// base: fields the file leaves out keep base's values. Unknown fields are
// errors, so a misspelt key is reported rather than ignored. It does not
// validate the result.
func LoadServerConfigFile(path string, base ServerConfig) (ServerConfig, error) {
	return configfile.Load(path, base)
}
