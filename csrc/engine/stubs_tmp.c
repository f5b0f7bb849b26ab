/* TEMPORARY stubs so the tree builds while the engine is written. */
#include "../common/internal.h"
void tf_loader_config_init(tf_loader_config *c) { (void)c; }
int tf_loader_create(const tf_dataset *d, const tf_loader_config *c, tf_loader **l) { (void)d; (void)c; (void)l; return -TF_EUNSUPPORTED; }
void tf_loader_free(tf_loader *l) { (void)l; }
int tf_loader_next(tf_loader *l, tf_batch **b) { (void)l; (void)b; return -TF_EUNSUPPORTED; }
uint64_t tf_loader_position(const tf_loader *l) { (void)l; return 0; }
int tf_loader_seek(tf_loader *l, uint64_t p) { (void)l; (void)p; return -TF_EUNSUPPORTED; }
void tf_batch_get_view(const tf_batch *b, tf_batch_view *v) { (void)b; (void)v; }
void tf_batch_release(tf_batch *b) { (void)b; }
void tf_loader_get_stats(const tf_loader *l, tf_loader_stats *s) { (void)l; (void)s; }
