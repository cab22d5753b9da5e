// Package kubeclient builds the API-server client configuration the gpuslice
// binaries share: a kubeconfig file when one is named, else the pod's
// in-cluster service account.
package kubeclient

import (
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Config returns the client configuration from the kubeconfig file at path,
// or the in-cluster one when path is empty, with userAgent set. Outside a
// cluster with no path the error is rest.ErrNotInCluster, so callers can
// tell "no API server configured" from a broken configuration.
func Config(path, userAgent string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if path != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", path)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = userAgent
	return cfg, nil
}
