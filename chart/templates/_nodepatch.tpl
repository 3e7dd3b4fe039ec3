{{/*
A ValidatingAdmissionPolicy (and its binding) confining a node agent's
identity, which RBAC must allow to patch Nodes, to what that agent does: set
the given labels and annotations on the node its own pod runs on, nothing else.
Used for the installer agent and the VFIO binder (validatingadmissionpolicy.yaml).

The node comes from the service-account token: a token bound to a pod carries
the pod's node in user extra `authentication.kubernetes.io/node-name`
(Kubernetes >= 1.30; the kubelet mounts such tokens). A token without it (e.g.
from `kubectl create token`) is refused. Everything else on the Node must stay
as it was: other labels, annotations, finalizers, owner references and the spec
(taints, unschedulable, podCIDR, ...). resourceVersion and managedFields may
change; status is not writable through the nodes resource.

Arguments (a dict): ctx (the root context), name, component, who (the agent in
messages), serviceAccount, labels, annotations (lists of keys),
validationActions.
*/}}
{{- define "ttdm.nodePatchPolicy" -}}
{{- $ := .ctx }}
{{- $quoted := dict "labels" list "annotations" list }}
{{- range .labels }}{{ $_ := set $quoted "labels" (append $quoted.labels (printf "'%s'" .)) }}{{ end }}
{{- range .annotations }}{{ $_ := set $quoted "annotations" (append $quoted.annotations (printf "'%s'" .)) }}{{ end }}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ .name }}
  labels:
    {{- include "ttdm.labels" $ | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["UPDATE"]
        resources: ["nodes"]
  matchConditions:
    - name: is-{{ .component }}
      expression: >-
        request.userInfo.username == 'system:serviceaccount:{{ $.Release.Namespace }}:{{ .serviceAccount }}'
  variables:
    - name: nodeName
      expression: >-
        has(request.userInfo.extra) &&
        'authentication.kubernetes.io/node-name' in request.userInfo.extra &&
        size(request.userInfo.extra['authentication.kubernetes.io/node-name']) > 0
        ? request.userInfo.extra['authentication.kubernetes.io/node-name'][0] : ''
    - name: ownLabels
      expression: >-
        [{{ join ", " $quoted.labels }}]
    - name: oldLabels
      expression: "has(oldObject.metadata.labels) ? oldObject.metadata.labels : {}"
    - name: newLabels
      expression: "has(object.metadata.labels) ? object.metadata.labels : {}"
    - name: ownAnnotations
      expression: >-
        [{{ join ", " $quoted.annotations }}]
    - name: oldAnnotations
      expression: "has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {}"
    - name: newAnnotations
      expression: "has(object.metadata.annotations) ? object.metadata.annotations : {}"
  validations:
    - expression: "variables.nodeName != ''"
      reason: Forbidden
      message: >-
        {{ .who }} may patch a node only with the service-account token of
        its pod (no authentication.kubernetes.io/node-name in the request)
    - expression: "object.metadata.name == variables.nodeName"
      reason: Forbidden
      messageExpression: >-
        '{{ .who }} running on node ' + variables.nodeName + ' may not modify node ' + object.metadata.name
    - expression: >-
        variables.newLabels.all(k, k in variables.ownLabels ||
          (k in variables.oldLabels && variables.oldLabels[k] == variables.newLabels[k])) &&
        variables.oldLabels.all(k, k in variables.ownLabels || k in variables.newLabels)
      reason: Forbidden
      message: >-
        {{ .who }} may change only the node labels {{ join ", " .labels }}
    - expression: >-
        variables.newAnnotations.all(k, k in variables.ownAnnotations ||
          (k in variables.oldAnnotations && variables.oldAnnotations[k] == variables.newAnnotations[k])) &&
        variables.oldAnnotations.all(k, k in variables.ownAnnotations || k in variables.newAnnotations)
      reason: Forbidden
      message: >-
        {{ .who }} may not change node annotations other than {{ join ", " .annotations }}
    - expression: >-
        has(object.metadata.finalizers) == has(oldObject.metadata.finalizers) &&
        (!has(object.metadata.finalizers) || object.metadata.finalizers == oldObject.metadata.finalizers) &&
        has(object.metadata.ownerReferences) == has(oldObject.metadata.ownerReferences) &&
        (!has(object.metadata.ownerReferences) || object.metadata.ownerReferences == oldObject.metadata.ownerReferences)
      reason: Forbidden
      message: {{ .who }} may not change node finalizers or owner references
    - expression: >-
        has(object.spec) == has(oldObject.spec) &&
        (!has(object.spec) || object.spec == oldObject.spec)
      reason: Forbidden
      message: {{ .who }} may not change the node spec (taints, unschedulable, ...)
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ .name }}
  labels:
    {{- include "ttdm.labels" $ | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  policyName: {{ .name }}
  validationActions:
    {{- toYaml .validationActions | nindent 4 }}
{{- end }}
