// Package chart holds the render tests of the Helm chart in charts/gpuslice.
// They run the real helm binary that hack/build-cluster.sh builds into
// _output/cluster/bin (found like the local cluster's binaries, see
// cluster.FindBinDir); all but the last three need no API server:
//
//   - TestChartGolden renders each values file of testdata/values with
//     `helm template`, lints it with `helm lint --strict`, compares the
//     render with testdata/golden/<name>.yaml (generated certificates
//     masked; regenerate with `go test ./chart/ -update`), and checks
//     invariants in Go: standard labels, namespaces, container hardening,
//     the webhook's excluded namespaces, and that every component
//     configuration in a ConfigMap loads and validates with the gpuslice
//     binary's own loader (and kube-scheduler's for its configuration), so a
//     chart/binary mismatch fails here rather than in a cluster.
//   - TestChartRejectsBadValues checks that bad values fail both `helm
//     template` and `helm lint` with an error naming the value and what is
//     allowed.
//   - TestAllocationPolicy creates the rendered ValidatingAdmissionPolicy
//     and the extender's ClusterRole in a real kube-apiserver run in the
//     test process (test/harness/apiserver) and checks who may write
//     hami.io/gpu-allocation: on a pod, and through a Binding posted to
//     pods/binding or to the older bindings resource.
//   - TestExtenderRBAC asks the same server's RBAC authorizer whether the
//     extender's ClusterRole and heartbeat Role grant what the extender
//     does and nothing beside it.
//   - TestExtenderNodeStatusPolicy creates the rendered policy on the
//     extender's Node writes in such a server and checks that its
//     ServiceAccount may change the GPUSliceRegistered condition of a Node's
//     status, as the extender patches it, and nothing else of a Node.
//
// Without a built helm the tests skip, except with CI=true, where they fail.
package chart
