package deploy_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
)

// Every rendering that turns the legacy view on (docs/dra.md) serves it in
// a host directory of its own, which consumers mount, and grants exactly
// what it reads, in a role of its own: list on this node's ResourceSlices
// and the DeviceClasses, get on ResourceClaims; a rendering without it
// grants none of that.
func TestTheLegacyViewGetsItsSocketAndOnlyTheRBACItReads(t *testing.T) {
	all := renderAll(t)
	dss := proxyDaemonSets(t, all)
	on := 0
	for _, r := range all {
		ds := dss[r.dir]
		if ds == nil {
			continue
		}
		t.Run(r.dir, func(t *testing.T) {
			var socket string
			var enabled bool
			for _, a := range proxyContainer(t, ds).Args {
				if v, ok := strings.CutPrefix(a, "--view=legacy="); ok {
					socket, enabled = v, true
				}
			}
			var role *rbacv1.ClusterRole
			for _, o := range r.objects {
				if o.kind == "ClusterRole" && o.name == "podres-proxy-dra" {
					role = o.value.(*rbacv1.ClusterRole)
				}
			}
			if !enabled {
				if role != nil {
					t.Error("the DRA role is granted without the legacy view")
				}
				return
			}
			on++
			dir := filepath.Dir(socket)
			mounted := false
			for _, m := range proxyContainer(t, ds).VolumeMounts {
				if m.MountPath != dir {
					continue
				}
				for _, v := range ds.Spec.Template.Spec.Volumes {
					mounted = mounted || (v.Name == m.Name && v.HostPath != nil && v.HostPath.Path == dir)
				}
			}
			if !mounted {
				t.Errorf("the legacy socket's directory %s is not the host's %s", dir, dir)
			}
			if role == nil {
				t.Fatal("the legacy view is on without its role")
			}
			var got []string
			for _, rule := range role.Rules {
				for _, g := range rule.APIGroups {
					for _, res := range rule.Resources {
						got = append(got, fmt.Sprintf("%s %s/%s", rule.Verbs, g, res))
					}
				}
			}
			slices.Sort(got)
			want := []string{"[get] resource.k8s.io/resourceclaims", "[list watch] resource.k8s.io/deviceclasses", "[list watch] resource.k8s.io/resourceslices"}
			if !slices.Equal(got, want) {
				t.Errorf("the DRA role grants %q, want exactly %q", got, want)
			}
			b := find[rbacv1.ClusterRoleBinding](t, r.objects, "ClusterRoleBinding", "podres-proxy-dra")
			want1 := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: ds.Spec.Template.Spec.ServiceAccountName, Namespace: ds.Namespace}
			if b.RoleRef.Name != role.Name || len(b.Subjects) != 1 || b.Subjects[0] != want1 {
				t.Errorf("the DRA binding %+v, want the role bound to %+v", b, want1)
			}
		})
	}
	if on == 0 {
		t.Error("no rendering turns the legacy view on")
	}
}
