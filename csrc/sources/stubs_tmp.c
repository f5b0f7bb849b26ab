/* TEMPORARY stubs so the tree builds while the parsers are written. */
#include "source.h"
int tf__open_megatron(const char *p, const tf_open_options *o, tf_file *f) { (void)o; (void)f; TF_FAIL(-TF_EUNSUPPORTED, "%s: not implemented", p); }
int tf__open_llmc(const char *p, const tf_open_options *o, tf_file *f) { (void)o; (void)f; TF_FAIL(-TF_EUNSUPPORTED, "%s: not implemented", p); }
int tf__open_raw(const char *p, const tf_open_options *o, tf_file *f) { (void)o; (void)f; TF_FAIL(-TF_EUNSUPPORTED, "%s: not implemented", p); }
int tf__open_npy(const char *p, const tf_open_options *o, tf_file *f) { (void)o; (void)f; TF_FAIL(-TF_EUNSUPPORTED, "%s: not implemented", p); }
