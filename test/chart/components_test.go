package chart

import (
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	kubeschedulerconfigv1 "k8s.io/kube-scheduler/config/v1"
	schedulerconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	schedulerscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	schedulervalidation "k8s.io/kubernetes/pkg/scheduler/apis/config/validation"
	"sigs.k8s.io/yaml"

	"github.com/gpuslice/gpuslice/deviceplugin"
	"github.com/gpuslice/gpuslice/dra"
	"github.com/gpuslice/gpuslice/extender"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/webhook"
)

// configFile is the file a container is told to read with --config=PATH, resolved to the
// ConfigMap key mounted there.
type configFile struct {
	ref       string // workload and container
	pod       corev1.PodSpec
	container corev1.Container
	path      string
	configMap string
	key       string
	data      string
}

// write stores the file's content in a temporary file for a component's loader.
func (f configFile) write(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), f.key)
	if err := os.WriteFile(p, []byte(f.data), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// loadedComponents are the configurations the render gives each binary, for cross-checks.
type loadedComponents struct {
	scheduler *kubeschedulerconfigv1.KubeSchedulerConfiguration
	extender  *extender.Config
	webhook   *webhook.ServerConfig
	// binaries counts the containers of each binary, whether their configuration loads or not.
	binaries map[string]int
}

// checkComponentConfigs loads every configuration file a container is told to read with the
// loader of the binary that reads it, validates it as the binary does, and checks that the
// chart wires it up: ports, mounts, the extender beside kube-scheduler, the webhook's namespaces.
// Every ConfigMap key must be read by some container.
func checkComponentConfigs(t *testing.T, r rendered) {
	files := configFiles(t, r)
	read := map[string]bool{}
	got := loadedComponents{binaries: map[string]int{}}
	for _, f := range files {
		read[f.configMap+"/"+f.key] = true
		binary := path.Base(f.container.Command[0])
		got.binaries[binary]++
		switch binary {
		case "gpuslice-device-plugin":
			checkDevicePluginConfig(t, f)
		case "gpuslice-dra-plugin":
			checkDRAPluginConfig(t, f)
		case "gpuslice-scheduler":
			got.extender = checkExtenderConfig(t, f)
		case "gpuslice-webhook":
			got.webhook = checkWebhookConfig(t, f)
		case "kube-scheduler":
			got.scheduler = checkSchedulerConfig(t, f)
		default:
			t.Errorf("%s: command %s is no gpuslice binary or kube-scheduler", f.ref, binary)
		}
	}
	for _, cm := range all[*corev1.ConfigMap](r) {
		if cm.Labels["app.kubernetes.io/component"] == "monitoring" {
			continue // the Grafana dashboard, read by Grafana's sidecar
		}
		for _, key := range sortedKeys(cm.Data) {
			if !read[cm.Name+"/"+key] {
				t.Errorf("ConfigMap %s: key %s is read by no container", cm.Name, key)
			}
		}
	}
	checkCrossComponent(t, r, got)
}

// configFiles returns the --config file of every container; a container without one is an error.
func configFiles(t *testing.T, r rendered) []configFile {
	t.Helper()
	var files []configFile
	for _, w := range r.workloads() {
		pod := w.template.Spec
		for _, c := range pod.Containers {
			ref := w.ref + " container " + c.Name
			if len(c.Command) == 0 {
				t.Errorf("%s: no command", ref)
				continue
			}
			i := slices.IndexFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--config=") })
			if i < 0 {
				t.Errorf("%s: no --config argument in %v", ref, c.Args)
				continue
			}
			f := configFile{ref: ref, pod: pod, container: c, path: strings.TrimPrefix(c.Args[i], "--config=")}
			mount, vol := mountOf(pod, c, path.Dir(f.path))
			if vol == nil || vol.ConfigMap == nil || mount.MountPath != path.Dir(f.path) {
				t.Errorf("%s: --config=%s is not a file of a ConfigMap volume", ref, f.path)
				continue
			}
			f.configMap, f.key = vol.ConfigMap.Name, path.Base(f.path)
			cm, _ := findTyped[*corev1.ConfigMap](r, "ConfigMap", w.meta.Namespace, f.configMap)
			if cm == nil {
				t.Errorf("%s: ConfigMap %s is not rendered", ref, f.configMap)
				continue
			}
			data, ok := cm.Data[f.key]
			if !ok {
				t.Errorf("%s: ConfigMap %s has no key %s (--config=%s)", ref, f.configMap, f.key, f.path)
				continue
			}
			f.data = data
			files = append(files, f)
		}
	}
	return files
}

// mountOf returns the container's mount holding dir (the longest mount path that is dir or a
// folder above it) and its pod volume, or nil.
func mountOf(pod corev1.PodSpec, c corev1.Container, dir string) (*corev1.VolumeMount, *corev1.Volume) {
	var best *corev1.VolumeMount
	for i, m := range c.VolumeMounts {
		if (dir == m.MountPath || strings.HasPrefix(dir, m.MountPath+"/")) && (best == nil || len(m.MountPath) > len(best.MountPath)) {
			best = &c.VolumeMounts[i]
		}
	}
	if best == nil {
		return nil, nil
	}
	for i, v := range pod.Volumes {
		if v.Name == best.Name {
			return best, &pod.Volumes[i]
		}
	}
	return best, nil
}

// checkPort checks that address (host:port) listens on the container port named name.
func checkPort(t *testing.T, f configFile, field, address, name string) {
	_, port, err := net.SplitHostPort(address)
	if err != nil {
		t.Errorf("%s: %s %q: %v", f.ref, field, address, err)
		return
	}
	for _, p := range f.container.Ports {
		if p.Name == name {
			if strconv.Itoa(int(p.ContainerPort)) != port {
				t.Errorf("%s: %s %q listens on port %s, but container port %s is %d", f.ref, field, address, port, name, p.ContainerPort)
			}
			return
		}
	}
	t.Errorf("%s: %s %q: the container declares no port %q", f.ref, field, address, name)
}

// checkHostFolder checks that the host folder dir is mounted into the container at the same
// path, as the device plugin requires of the paths it hands to the kubelet and the runtime.
func checkHostFolder(t *testing.T, f configFile, field, dir string) {
	mount, vol := mountOf(f.pod, f.container, dir)
	if vol == nil || vol.HostPath == nil || vol.HostPath.Path != mount.MountPath {
		t.Errorf("%s: %s %q is not inside a hostPath volume mounted at its host path", f.ref, field, dir)
	}
}

func checkDevicePluginConfig(t *testing.T, f configFile) {
	cfg, err := deviceplugin.LoadConfigFile(f.write(t), deviceplugin.DefaultConfig())
	if err != nil {
		t.Errorf("%s: ConfigMap %s key %s: %v", f.ref, f.configMap, f.key, err)
		return
	}
	cfg.NodeName = "gpu-node-1" // from the NODE_NAME environment variable in the pod
	if err := cfg.Validate(); err != nil {
		t.Errorf("%s: ConfigMap %s key %s: %v", f.ref, f.configMap, f.key, err)
	}
	if !slices.ContainsFunc(f.container.Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}) {
		t.Errorf("%s: NODE_NAME does not come from spec.nodeName", f.ref)
	}
	checkPort(t, f, "healthAddress", cfg.HealthAddress, "health")
	checkHostFolder(t, f, "devicePluginDir", cfg.DevicePluginDir)
	checkHostFolder(t, f, "podResourcesSocket's folder", path.Dir(cfg.PodResourcesSocket))
	checkHostFolder(t, f, "stateDir", cfg.EffectiveStateDir())
	checkHostFolder(t, f, "mpsDir", cfg.MPSDir)
	for _, p := range cfg.NVIDIACDISpecs {
		checkHostFolder(t, f, "nvidiaCDISpecs", path.Dir(p))
	}
	if cfg.Mode == deviceplugin.ModeCDI {
		checkHostFolder(t, f, "cdiSpecDir", cfg.CDISpecDir)
	}
}

// checkDRAPluginConfig loads the DRA driver's file as the binary does and checks that its host
// folders are mounted and its probe port declared.
func checkDRAPluginConfig(t *testing.T, f configFile) {
	cfg, err := dra.LoadConfigFile(f.write(t), dra.DefaultConfig())
	if err != nil {
		t.Errorf("%s: ConfigMap %s key %s: %v", f.ref, f.configMap, f.key, err)
		return
	}
	cfg.NodeName = "gpu-node-1" // from the NODE_NAME environment variable in the pod
	if err := cfg.Validate(); err != nil {
		t.Errorf("%s: ConfigMap %s key %s: %v", f.ref, f.configMap, f.key, err)
	}
	if cfg.DriverName != dra.DefaultDriverName {
		t.Errorf("%s: driverName %q, want %q: the DeviceClass and the webhook's claims name it", f.ref, cfg.DriverName, dra.DefaultDriverName)
	}
	checkPort(t, f, "healthAddress", cfg.HealthAddress, "health")
	checkHostFolder(t, f, "registrarDir", cfg.RegistrarDir)
	checkHostFolder(t, f, "pluginDir", cfg.PluginDir)
	checkHostFolder(t, f, "stateDir", cfg.StateDir)
	checkHostFolder(t, f, "cdiSpecDir", cfg.CDISpecDir)
}

func checkExtenderConfig(t *testing.T, f configFile) *extender.Config {
	cfg, err := extender.LoadConfigFile(f.write(t), extender.DefaultConfig())
	if err != nil {
		t.Errorf("%s: ConfigMap %s key %s: %v", f.ref, f.configMap, f.key, err)
		return nil
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("%s: ConfigMap %s key %s: %v", f.ref, f.configMap, f.key, err)
	}
	checkPort(t, f, "healthAddress", cfg.HealthAddress, "health")
	return &cfg
}

func checkWebhookConfig(t *testing.T, f configFile) *webhook.ServerConfig {
	cfg, err := webhook.LoadServerConfigFile(f.write(t), webhook.DefaultServerConfig())
	if err != nil {
		t.Errorf("%s: ConfigMap %s key %s: %v", f.ref, f.configMap, f.key, err)
		return nil
	}
	// Validate checks that the certificate files are named; the server reads them.
	if err := cfg.Validate(); err != nil {
		t.Errorf("%s: ConfigMap %s key %s: %v", f.ref, f.configMap, f.key, err)
	}
	checkPort(t, f, "address", cfg.Address, "https")
	for _, tls := range []struct{ field, file, key string }{
		{"tlsCertFile", cfg.TLSCertFile, corev1.TLSCertKey},
		{"tlsKeyFile", cfg.TLSKeyFile, corev1.TLSPrivateKeyKey},
	} {
		_, vol := mountOf(f.pod, f.container, tls.file)
		if vol == nil || vol.Secret == nil || path.Base(tls.file) != tls.key {
			t.Errorf("%s: %s %q is not key %s of a mounted kubernetes.io/tls Secret", f.ref, tls.field, tls.file, tls.key)
		}
	}
	return &cfg
}

// checkSchedulerConfig decodes kube-scheduler's configuration strictly into the v1 types and,
// as kube-scheduler itself does, with its scheme, defaulting and validation; then checks the
// gpuslice extender entry.
func checkSchedulerConfig(t *testing.T, f configFile) *kubeschedulerconfigv1.KubeSchedulerConfiguration {
	var cfg kubeschedulerconfigv1.KubeSchedulerConfiguration
	if err := yaml.UnmarshalStrict([]byte(f.data), &cfg); err != nil {
		t.Errorf("%s: ConfigMap %s key %s: %v", f.ref, f.configMap, f.key, err)
		return nil
	}
	if gvk := cfg.GroupVersionKind(); gvk != kubeschedulerconfigv1.SchemeGroupVersion.WithKind("KubeSchedulerConfiguration") {
		t.Errorf("%s: %s is a %v", f.ref, f.key, gvk)
	}
	obj, _, err := schedulerscheme.Codecs.UniversalDecoder().Decode([]byte(f.data), nil, nil)
	if internal, ok := obj.(*schedulerconfig.KubeSchedulerConfiguration); err != nil || !ok {
		t.Errorf("%s: kube-scheduler's decoder rejects %s: %v (%T)", f.ref, f.key, err, obj)
	} else if errs := schedulervalidation.ValidateKubeSchedulerConfiguration(internal); errs != nil {
		t.Errorf("%s: kube-scheduler's validation rejects %s: %v", f.ref, f.key, errs)
	}
	// kube-scheduler's HTTPS port is a flag: its probes and the declared port must agree with it.
	if i := slices.IndexFunc(f.container.Args, func(a string) bool { return strings.HasPrefix(a, "--secure-port=") }); i < 0 {
		t.Errorf("%s: no --secure-port argument in %v: the probes would name a port it may not serve", f.ref, f.container.Args)
	} else {
		checkPort(t, f, "--secure-port", ":"+strings.TrimPrefix(f.container.Args[i], "--secure-port="), "https")
	}
	if ns := cfg.LeaderElection.ResourceNamespace; ns != releaseNamespace {
		t.Errorf("%s: leaderElection.resourceNamespace %q, want %q (the Role grants the Lease there)", f.ref, ns, releaseNamespace)
	}
	if len(cfg.Extenders) != 1 && len(cfg.Extenders) != 2 {
		t.Errorf("%s: %d extenders, want the gpuslice extender, and its DRA scoring", f.ref, len(cfg.Extenders))
		return &cfg
	}
	if len(cfg.Extenders) == 2 {
		// The DRA scoring (dra.enabled): prioritize only, asked about every pod of the profile
		// (no managedResources), never failing a pod.
		d := cfg.Extenders[1]
		got := struct{ Filter, Prioritize, Bind, NodeCacheCapable, Ignorable, Managed, URL any }{d.FilterVerb, d.PrioritizeVerb, d.BindVerb, d.NodeCacheCapable, d.Ignorable, len(d.ManagedResources), d.URLPrefix}
		want := struct{ Filter, Prioritize, Bind, NodeCacheCapable, Ignorable, Managed, URL any }{"", "dra/prioritize", "", true, true, 0, cfg.Extenders[0].URLPrefix}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: DRA scoring extender (-want +got):\n%s", f.ref, diff)
		}
	}
	e := cfg.Extenders[0]
	// prioritizeVerb is checked against the extender's filterResult (checkCrossComponent).
	got := struct{ Filter, Bind, NodeCacheCapable, Ignorable any }{e.FilterVerb, e.BindVerb, e.NodeCacheCapable, e.Ignorable}
	want := struct{ Filter, Bind, NodeCacheCapable, Ignorable any }{"filter", "bind", true, false}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%s: extender verbs (-want +got):\n%s", f.ref, diff)
	}
	for _, p := range cfg.Profiles {
		if p.PercentageOfNodesToScore == nil {
			t.Errorf("%s: profile %v sets no percentageOfNodesToScore: kube-scheduler would send the extender only its adaptive sample of the feasible nodes", f.ref, ptrString(p.SchedulerName))
		}
	}
	// The extender judges the hami.io resources: either it manages them, ignored by
	// kube-scheduler, or (placePodsWithoutGPU, so that it is asked about every pod) it manages
	// none and every profile's NodeResourcesFit ignores them.
	var wantManaged []kubeschedulerconfigv1.ExtenderManagedResource
	var names []string
	for _, name := range vgpu.Resources() {
		wantManaged = append(wantManaged, kubeschedulerconfigv1.ExtenderManagedResource{Name: string(name), IgnoredByScheduler: true})
		names = append(names, string(name))
	}
	if len(e.ManagedResources) == 0 {
		for _, p := range cfg.Profiles {
			if diff := cmp.Diff(names, fitIgnoredResources(t, f, p)); diff != "" {
				t.Errorf("%s: profile %v: the extender manages no resource, so NodeResourcesFit must ignore the hami.io ones (-want +got):\n%s", f.ref, ptrString(p.SchedulerName), diff)
			}
		}
	} else if diff := cmp.Diff(wantManaged, e.ManagedResources); diff != "" {
		t.Errorf("%s: extender managedResources (-want +got):\n%s", f.ref, diff)
	}
	return &cfg
}

// checkCrossComponent checks what the components must agree on.
func checkCrossComponent(t *testing.T, r rendered, got loadedComponents) {
	daemonSets := 0
	for _, w := range r.workloads() {
		if w.replicas == 0 {
			daemonSets++
		}
	}
	if n := got.binaries["gpuslice-device-plugin"] + got.binaries["gpuslice-dra-plugin"]; n != daemonSets {
		t.Errorf("%d device-plugin and DRA driver containers for %d DaemonSets", n, daemonSets)
	}
	if s, x := got.binaries["kube-scheduler"], got.binaries["gpuslice-scheduler"]; s != x {
		t.Errorf("%d kube-scheduler containers and %d extender containers; they run together", s, x)
	}
	if got.scheduler != nil && got.extender != nil && len(got.scheduler.Extenders) >= 1 {
		e, x := got.scheduler.Extenders[0], got.extender
		// kube-scheduler asks /dra/prioritize exactly when the extender watches DRA objects.
		if dra := len(got.scheduler.Extenders) == 2; dra != x.DRA {
			t.Errorf("kube-scheduler calls the DRA scoring: %t; the extender's dra: %t", dra, x.DRA)
		}
		if got.webhook != nil && got.webhook.DRA.Score && !x.DRA {
			t.Errorf("the webhook steers converted pods to the gpuslice profile (dra.score), whose extender does not score DRA pods")
		}
		scheme := map[bool]string{false: "http", true: "https"}[e.EnableHTTPS]
		if want := scheme + "://" + x.Address; e.URLPrefix != want {
			t.Errorf("kube-scheduler calls the extender at %q, but it serves %s", e.URLPrefix, want)
		}
		if e.EnableHTTPS != (x.TLSCertFile != "") {
			t.Errorf("kube-scheduler enableHTTPS %v, extender tlsCertFile %q", e.EnableHTTPS, x.TLSCertFile)
		}
		if cc := got.scheduler.ClientConnection; x.KubeAPIQPS < cc.QPS || int64(x.KubeAPIBurst) < int64(cc.Burst) {
			t.Errorf("the extender's API client (kubeAPIQPS %v, kubeAPIBurst %d) is below kube-scheduler's clientConnection (qps %v, burst %d): binding every GPU pod would limit scheduling",
				x.KubeAPIQPS, x.KubeAPIBurst, cc.QPS, cc.Burst)
		}
		// filterResult best passes only the best-scoring nodes: a prioritize call would add
		// a round trip and nothing else. feasible needs it, or every fitting node ties.
		if wantVerb := map[extender.FilterResult]string{extender.FilterResultFeasible: "prioritize"}[x.FilterResult]; e.PrioritizeVerb != wantVerb {
			t.Errorf("kube-scheduler's extender prioritizeVerb %q with the extender's filterResult %q, want %q", e.PrioritizeVerb, x.FilterResult, wantVerb)
		}
		if e.HTTPTimeout.Duration <= x.BindTimeout.Duration {
			t.Errorf("kube-scheduler's extender httpTimeout %v is not above the extender's bindTimeout %v", e.HTTPTimeout.Duration, x.BindTimeout.Duration)
		}
	}
	if got.webhook == nil {
		return
	}
	if got.scheduler != nil && !slices.ContainsFunc(got.scheduler.Profiles, func(p kubeschedulerconfigv1.KubeSchedulerProfile) bool {
		return p.SchedulerName != nil && *p.SchedulerName == got.webhook.SchedulerName
	}) {
		t.Errorf("the webhook steers GPU pods to scheduler %q, which no kube-scheduler profile serves", got.webhook.SchedulerName)
	}
	for _, mwc := range all[*admissionregistrationv1.MutatingWebhookConfiguration](r) {
		for _, wh := range mwc.Webhooks {
			want := slices.Sorted(slices.Values(excludedNamespaces(wh.NamespaceSelector)))
			gotNS := slices.Sorted(slices.Values(got.webhook.ExcludedNamespaces))
			if diff := cmp.Diff(want, gotNS); diff != "" {
				t.Errorf("webhook %s: the server's excludedNamespaces differ from the namespaceSelector's (-selector +server):\n%s", wh.Name, diff)
			}
		}
	}
}

// ptrString returns *p, or "<unset>" for nil.
func ptrString(p *string) string {
	if p == nil {
		return "<unset>"
	}
	return *p
}

// fitIgnoredResources returns the ignoredResources of profile p's NodeResourcesFit args.
func fitIgnoredResources(t *testing.T, f configFile, p kubeschedulerconfigv1.KubeSchedulerProfile) []string {
	for _, pc := range p.PluginConfig {
		if pc.Name != "NodeResourcesFit" {
			continue
		}
		var args kubeschedulerconfigv1.NodeResourcesFitArgs
		if err := yaml.UnmarshalStrict(pc.Args.Raw, &args); err != nil {
			t.Errorf("%s: NodeResourcesFit args: %v", f.ref, err)
		}
		return args.IgnoredResources
	}
	return nil
}
