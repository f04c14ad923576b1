//! Where policies come from: a watched file, or the CRD through kube-runtime (issue 3).
