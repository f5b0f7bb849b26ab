/* TEMPORARY stubs so the tree builds while the parsers are written. */
#include "source.h"
int tf__open_megatron(const char *p, const tf_open_options *o, tf_file *f) { (void)o; (void)f; TF_FAIL(-TF_EUNSUPPORTED, "%s: not implemented", p); }
int tf__open_llmc(const char *p, const tf_open_options *o, tf_file *f) { (void)o; (void)f; TF_FAIL(-TF_EUNSUPPORTED, "%s: not implemented", p); }
int tf__open_raw(const char *p, const tf_open_options *o, tf_file *f) { (void)o; (void)f; TF_FAIL(-TF_EUNSUPPORTED, "%s: not implemented", p); }
int tf__open_npy(const char *p, const tf_open_options *o, tf_file *f) { (void)o; (void)f; TF_FAIL(-TF_EUNSUPPORTED, "%s: not implemented", p); }
void tf_writer_options_init(tf_writer_options *o) { (void)o; }
int tf_writer_create(const char *d, const tf_writer_options *o, tf_writer **w) { (void)d; (void)o; (void)w; return -TF_EUNSUPPORTED; }
int tf_writer_add_document(tf_writer *w, const void *t, uint64_t n, tf_dtype s) { (void)w; (void)t; (void)n; (void)s; return -TF_EUNSUPPORTED; }
int tf_writer_finish(tf_writer *w) { (void)w; return -TF_EUNSUPPORTED; }
uint64_t tf_writer_num_documents(const tf_writer *w) { (void)w; return 0; }
uint64_t tf_writer_num_tokens(const tf_writer *w) { (void)w; return 0; }
void tf_writer_free(tf_writer *w) { (void)w; }
